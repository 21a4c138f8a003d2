// A listing's page that fits in a response: the store pages by count (page_size), and a page
// of the largest items a client may store could still exceed what a client can receive. So
// the page is fetched again with fewer items while its items would exceed the byte budget;
// the store's next_page_token then goes on after the last item sent, and paging still
// returns everything. One item always goes (the request limits keep one well within it).
#pragma once

#include <cstdint>
#include <vector>

#include <google/protobuf/message.h>

namespace recal::api {

// How many of `items`, from the first, fit in `max_bytes` of a response (each as a length-
// delimited field: its bytes, a tag and a length).
template <typename Item>
size_t ItemsWithin(const std::vector<Item>& items, int64_t max_bytes) {
  int64_t used = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    used += static_cast<int64_t>(items[i].ByteSizeLong()) + 6;
    if (used > max_bytes) return i;
  }
  return items.size();
}

// `fetch(page_size)` returns absl::StatusOr<Page>; `items_of(page)` its items. The
// next_page_token's few bytes come out of `max_bytes` too.
template <typename Fetch, typename ItemsOf>
auto PageWithin(int page_size, int64_t max_bytes, Fetch fetch, ItemsOf items_of) -> decltype(fetch(page_size)) {
  constexpr int64_t kTokenRoom = 512;
  int size = page_size;
  while (true) {
    auto page = fetch(size);
    if (!page.ok()) return page;
    const auto& items = items_of(*page);
    const size_t fit = ItemsWithin(items, max_bytes - kTokenRoom);
    if (fit == items.size() || items.size() <= 1) return page;
    size = fit > 0 ? static_cast<int>(fit) : 1;  // fewer than this page had: the loop ends
  }
}

}  // namespace recal::api
