#include "server/relay/endpoint_heartbeat.h"

#include "absl/time/clock.h"
#include "server/log/log.h"

namespace recal::relay {

void EndpointHeartbeat::Put(int64_t now_ms) {
  const absl::Status put = metadata_->PutWorkerEndpoint(owner_, address_, now_ms);
  // Said once per change of fortune, not at every beat of an outage.
  std::lock_guard<std::mutex> lock(mu_);
  if (put.ok() != last_put_ok_) {
    last_put_ok_ = put.ok();
    if (!put.ok()) {
      log::Warning("recal-server: cannot record the internal endpoint in the store; api replicas do not send "
                   "this worker inspections until it can",
                   {{"advertised", address_}, {"error", std::string(put.message())}});
    }
  }
}

void EndpointHeartbeat::Start() {
  Put(absl::ToUnixMillis(absl::Now()));
  beats_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, absl::ToChronoMilliseconds(interval_), [this] { return stopping_; })) {
      lock.unlock();
      Put(absl::ToUnixMillis(absl::Now()));
      lock.lock();
    }
  });
}

void EndpointHeartbeat::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (!beats_.joinable()) return;  // never started
  beats_.join();
  metadata_->PutWorkerEndpoint(owner_, address_, 0).IgnoreError();
}

}  // namespace recal::relay
