// recal_example [HOST:PORT]: parses a data spec (no server needed) and, given an address,
// asks the server's health. Shows the installed recal::client in use.
#include <cstdio>

#include "recal/client.h"
#include "recal/data.h"

int main(int argc, char** argv) {
  auto source = recal::DataSourceFromSpec("safetensors:calib/images.safetensors:pixels");
  if (!source.ok()) {
    std::fprintf(stderr, "%s\n", source.status().ToString().c_str());
    return 1;
  }
  std::printf("data source: %s\n", recal::DataSourceToSpec(*source).c_str());
  if (argc < 2) return 0;

  auto client = recal::Client::Connect(argv[1]);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  auto health = (*client)->Health();
  if (!health.ok()) {
    std::fprintf(stderr, "%s\n", health.status().ToString().c_str());
    return 1;
  }
  std::printf("%s: %s\n", argv[1], health->c_str());
  return 0;
}
