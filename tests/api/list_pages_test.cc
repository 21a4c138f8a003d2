#include "server/api/list_pages.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"

namespace recal::api {
namespace {

struct Page {
  std::vector<v1::Job> jobs;
  std::string next_page_token;
};

// A store of `n` jobs of `bytes` each, listed from `after` as the store pages: by count.
struct FakeStore {
  std::vector<v1::Job> jobs;
  int fetches = 0;
  absl::StatusOr<Page> List(int page_size, size_t after) {
    ++fetches;
    Page page;
    const size_t size = page_size <= 0 ? 100 : page_size;
    for (size_t i = after; i < jobs.size() && page.jobs.size() < size; ++i) page.jobs.push_back(jobs[i]);
    if (after + page.jobs.size() < jobs.size()) page.next_page_token = std::to_string(after + page.jobs.size());
    return page;
  }
};

FakeStore StoreOf(int n, size_t bytes) {
  FakeStore store;
  for (int i = 0; i < n; ++i) {
    v1::Job job;
    job.set_id("job-" + std::to_string(i));
    (*job.mutable_spec()->mutable_labels())["big"] = std::string(bytes, 'x');
    store.jobs.push_back(job);
  }
  return store;
}

// Every page of the listing, following the tokens.
std::vector<Page> AllPages(FakeStore& store, int page_size, int64_t max_bytes) {
  std::vector<Page> pages;
  size_t after = 0;
  while (true) {
    auto page = PageWithin(
        page_size, max_bytes, [&](int size) { return store.List(size, after); },
        [](const Page& p) -> const std::vector<v1::Job>& { return p.jobs; });
    EXPECT_TRUE(page.ok());
    pages.push_back(*page);
    if (page->next_page_token.empty()) return pages;
    after = std::stoul(page->next_page_token);
  }
}

TEST(PageWithinTest, PagesOfLargeItemsStayWithinTheBudgetAndReturnEverything) {
  FakeStore store = StoreOf(50, 100000);
  const int64_t budget = 1 << 20;
  const std::vector<Page> pages = AllPages(store, 1000, budget);
  size_t listed = 0;
  for (const Page& page : pages) {
    v1::ListJobsResponse response;
    for (const v1::Job& job : page.jobs) *response.add_jobs() = job;
    response.set_next_page_token(page.next_page_token);
    EXPECT_LE(static_cast<int64_t>(response.ByteSizeLong()), budget);
    EXPECT_GE(page.jobs.size(), 1u);
    listed += page.jobs.size();
  }
  EXPECT_EQ(listed, 50u);
  EXPECT_GT(pages.size(), 1u);
}

TEST(PageWithinTest, SmallItemsAreOnePageFetchedOnce) {
  FakeStore store = StoreOf(20, 10);
  const std::vector<Page> pages = AllPages(store, 0, 1 << 20);
  ASSERT_EQ(pages.size(), 1u);
  EXPECT_EQ(pages[0].jobs.size(), 20u);
  EXPECT_EQ(store.fetches, 1);
}

TEST(PageWithinTest, AnItemLargerThanTheBudgetStillGoesAloneSoPagingEnds) {
  FakeStore store = StoreOf(3, 5000);
  const std::vector<Page> pages = AllPages(store, 10, 1000);
  ASSERT_EQ(pages.size(), 3u);
  for (const Page& page : pages) EXPECT_EQ(page.jobs.size(), 1u);
}

}  // namespace
}  // namespace recal::api
