// A worker process's presence in the cluster: it puts its internal endpoint in the store when
// it starts and then every store::kWorkerEndpointHeartbeat, so that api replicas know which workers are up
// to inspect their uploads (remote_inspector.h); stopping, it says it is gone.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "server/store/metadata_store.h"

namespace recal::relay {

class EndpointHeartbeat {
 public:
  // `owner`: the name this process's leases carry (where the scheduler records the endpoint
  // too); `address`: the endpoint as advertised.
  EndpointHeartbeat(store::MetadataStore* metadata, std::string owner, std::string address,
                    absl::Duration interval = store::kWorkerEndpointHeartbeat)
      : metadata_(metadata), owner_(std::move(owner)), address_(std::move(address)), interval_(interval) {}
  ~EndpointHeartbeat() { Stop(); }

  // Puts the endpoint now (a store that does not answer yet is logged, and tried again at the
  // next beat), then every interval on a thread of its own.
  void Start();
  // Ends the beats and puts the endpoint as last heard from at the epoch: no api replica
  // sends this process another inspection. Idempotent.
  void Stop();

 private:
  void Put(int64_t now_ms);

  store::MetadataStore* const metadata_;
  const std::string owner_;
  const std::string address_;
  const absl::Duration interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool last_put_ok_ = true;
  std::thread beats_;
};

}  // namespace recal::relay
