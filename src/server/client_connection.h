// Whether the client of a request being handled has gone away.
//
// httplib 0.11 gives a handler no access to its connection's socket (later versions have
// Request::is_connection_closed), so the socket is found by its addresses: the one descriptor
// of this process whose local and peer addresses are the request's (Linux: /proc/self/fd). The
// descriptor stays this connection's until the handler returns, when httplib closes it. Streamed
// responses do not need this: their DataSink::is_writable() checks the socket.
#pragma once

namespace httplib {
struct Request;
}

namespace specdec::server {

class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req);
  // The peer closed or reset the connection. False when the socket was not found.
  bool closed() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Shuts down the reading side of every connection accepted on `local_port` (at shutdown, once
// no request is in flight): a connection idling between keep-alive requests ends at once
// instead of after httplib's keep-alive timeout; responses still being written are not cut.
void shutdown_connection_reads(int local_port);

}  // namespace specdec::server
