#include "server/client_connection.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include <httplib.h>

namespace specdec::server {
namespace {

// The numeric host and port of a socket address, as httplib renders remote_addr.
bool host_port(const sockaddr_storage& addr, socklen_t len, std::string* host, int* port) {
  char buf[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, buf, sizeof(buf), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return false;
  }
  *host = buf;
  if (addr.ss_family == AF_INET) {
    *port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    *port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return false;
  }
  return true;
}

bool matches(int fd, const httplib::Request& req) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  std::string host;
  int port = -1;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      !host_port(addr, len, &host, &port) || port != req.local_port) {
    return false;
  }
  len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      !host_port(addr, len, &host, &port)) {
    return false;
  }
  return port == req.remote_port && host == req.remote_addr;
}

// Calls f(fd) for each open descriptor of this process until it returns true.
template <typename F>
void for_each_fd(F f) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const int own = dirfd(dir);
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    if (f(static_cast<int>(fd))) break;
  }
  closedir(dir);
}

}  // namespace

ClientConnection::ClientConnection(const httplib::Request& req) {
  if (req.remote_port < 0 || req.local_port < 0) return;
  for_each_fd([&](int fd) {
    if (!matches(fd, req)) return false;
    fd_ = fd;
    return true;
  });
}

void shutdown_connection_reads(int local_port) {
  for_each_fd([&](int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    std::string host;
    int port = -1;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        !host_port(addr, len, &host, &port) || port != local_port) {
      return false;
    }
    len = sizeof(addr);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ::shutdown(fd, SHUT_RD);
    return false;
  });
}

bool ClientConnection::closed() const {
  if (fd_ < 0) return false;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLIN | POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  if ((p.revents & POLLIN) != 0) {
    char c;
    // 0: orderly shutdown by the peer; > 0: it sent more (a pipelined request): still there.
    return recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

}  // namespace specdec::server
