// Safety rules (docs/safety.md) checked from outside, with real processes:
// - another user (a child that drops to nobody, 65534) can neither open the pool segment
//   (shm_open -> EACCES) nor talk to the server through the ipc socket (file 0600);
// - a tcp endpoint binds loopback unless --listen-all (read back from /proc/net/tcp);
// - a consumer that forges releases for every (slot, seq), releases twice what it really got,
//   and a peer that never said hello, cannot make the server reuse a slot under real consumers:
//   probe consumers hold each batch a while and then verify every byte.
// The other-user test needs root (setuid); it skips itself otherwise.
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cstring>
#include <zmq.hpp>

#include "common/process.h"
#include "protocol/messages.h"
#include "shm/slot_pool.h"
#include "tests/cpp/hardening/hardening.h"

namespace batchcast::testing {
namespace {

TEST(Permissions, AnotherUserCanNeitherMapThePoolNorTalkToTheServer) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to another user";
  auto ep = unique_endpoint("perm");
  ChildProcess server(
      serve_args(ep, {"--synthetic", "500", "--sample-bytes", "32", "--epochs", "1"}));
  ASSERT_TRUE(server.wait_for_err("serving on", 20)) << server.err();
  const std::string segment = segment_name_for(ep), sock = ipc_path(ep);
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm/" + segment).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "pool segment mode";
  ASSERT_EQ(::stat(sock.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "ipc socket file mode";

  pid_t child = ::fork();
  if (child == 0) {  // nobody from here on; exit codes say what it managed to do
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(20);
    int fd = ::shm_open(("/" + segment).c_str(), O_RDONLY, 0);
    if (fd >= 0) ::_exit(10);  // opened another user's pool
    if (errno != EACCES) ::_exit(11);
    int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, sock.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) ::_exit(12);
    ::close(s);
    // Through ZeroMQ too: the connect is asynchronous, so the proof is that no Welcome comes.
    zmq::context_t ctx;
    zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(ep);
    protocol::Hello hello;
    hello.pid = static_cast<uint32_t>(::getpid());
    auto bytes = protocol::encode(hello);
    (void)dealer.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(1500));
    ::_exit(item.revents & ZMQ_POLLIN ? 13 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10: nobody opened the pool; 11: shm_open failed but not with EACCES; 12: nobody "
         "connected to the ipc socket; 13: nobody got an answer; 20: could not drop privileges";

  // The owner still can: one consumer reads the whole stream and the server exits cleanly.
  ChildProcess probe({probe_bin(), "--endpoint", ep, "--timeout", "30"});
  ASSERT_EQ(probe.wait(30), 0) << probe.err();
  EXPECT_EQ(check_epochs(parse_probe(probe), 500), "");
  EXPECT_EQ(server.wait(10), 0) << server.err();
  EXPECT_FALSE(file_exists("/dev/shm/" + segment));
  EXPECT_FALSE(file_exists(sock));
}

// Local address (hex, as /proc/net/tcp writes it) of the socket listening on `port`, or "".
std::string listening_address(int port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);
  char want[8];
  std::snprintf(want, sizeof(want), "%04X", port);
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string sl, local, remote, state;
    in >> sl >> local >> remote >> state;
    if (state == "0A" && local.substr(local.find(':') + 1) == want)
      return local.substr(0, local.find(':'));
  }
  return "";
}

int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

TEST(Permissions, TcpBindsLoopbackUnlessListenAll) {
  for (bool all : {false, true}) {
    SCOPED_TRACE(all ? "--listen-all" : "default");
    int port = free_port();
    auto ep = "tcp://*:" + std::to_string(port);
    auto args = serve_args(ep, {"--synthetic", "100", "--epochs", "0"});
    if (all) args.push_back("--listen-all");
    ChildProcess server(args);
    ASSERT_TRUE(server.wait_for_err("serving on", 20)) << server.err();
    std::string addr;
    for (int i = 0; i < 50 && addr.empty(); ++i) {
      addr = listening_address(port);
      if (addr.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(addr, all ? "00000000" : "0100007F") << "listening address of port " << port;
    server.signal(SIGTERM);
    EXPECT_EQ(server.wait(10), 0) << server.err();
  }
}

// A hostile consumer: says hello, takes chunks and releases them (so it never stalls the ring),
// but also releases each twice and spams releases for every slot around the current seq.
// A second socket that never said hello spams the same. Stops at End.
void forge(const std::string& ep, uint32_t slots, std::atomic<uint64_t>* forged,
           std::atomic<bool>* stop) {
  zmq::context_t ctx;
  zmq::socket_t evil(ctx, zmq::socket_type::dealer), stranger(ctx, zmq::socket_type::dealer);
  for (auto* s : {&evil, &stranger}) {
    s->set(zmq::sockopt::linger, 0);
    s->connect(ep);
  }
  auto send = [](zmq::socket_t& s, const protocol::Message& m) {
    auto bytes = protocol::encode(m);
    (void)s.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  };
  protocol::Hello hello;
  hello.pid = static_cast<uint32_t>(::getpid());
  hello.boot_id = host_boot_id();
  hello.name = "forger";
  send(evil, hello);
  uint64_t top = 0;
  while (!*stop) {
    zmq::message_t msg;
    while (evil.recv(msg, zmq::recv_flags::dontwait)) {
      auto r = protocol::decode(msg.data(), msg.size());
      if (!r.message) continue;
      if (std::holds_alternative<protocol::Welcome>(*r.message)) send(evil, protocol::Credit{64});
      if (auto* d = std::get_if<protocol::ChunkDescriptor>(&*r.message)) {
        top = std::max(top, d->seq);
        send(evil, protocol::Release{d->seq, d->slot});
        send(evil, protocol::Release{d->seq, d->slot});  // a double release
        send(evil, protocol::Credit{1});
      }
      if (std::holds_alternative<protocol::End>(*r.message)) {
        send(evil, protocol::Goodbye{});
        *stop = true;
      }
    }
    for (uint64_t seq = top > 16 ? top - 16 : 0; seq < top + 16; ++seq)
      for (uint32_t slot = 0; slot < slots; ++slot) {
        send(evil, protocol::Release{seq, slot});
        send(stranger, protocol::Release{seq, slot});
        *forged += 2;
      }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST(Permissions, ForgedAndDoubleReleasesNeverCorruptOtherConsumers) {
  auto ep = unique_endpoint("forge");
  const int64_t n = 3000;
  ChildProcess server(
      serve_args(ep, {"--synthetic", std::to_string(n), "--sample-bytes", "256", "--batch-size",
                      "32", "--ring", "4", "--epochs", "2", "--min-consumers", "3"}));
  ASSERT_TRUE(server.wait_for_err("serving on", 20)) << server.err();
  std::atomic<uint64_t> forged{0};
  std::atomic<bool> stop{false};
  std::thread forger(forge, ep, 4, &forged, &stop);
  // Zero-copy views held 2 ms before checking, and copied batches spanning chunks.
  ChildProcess a({probe_bin(), "--endpoint", ep, "--timeout", "30", "--batch-size", "32",
                  "--verify-delay-ms", "2"});
  ChildProcess b({probe_bin(), "--endpoint", ep, "--timeout", "30", "--batch-size", "50",
                  "--verify-delay-ms", "1"});
  int ra = a.wait(120), rb = b.wait(120);
  stop = true;
  forger.join();
  EXPECT_EQ(ra, 0) << "3: a byte was wrong (slot reused under it); " << a.err();
  EXPECT_EQ(rb, 0) << "3: a byte was wrong (slot reused under it); " << b.err();
  for (auto* p : {&a, &b}) {
    auto run = parse_probe(*p);
    EXPECT_EQ(run.ended_epochs.size(), 2u);
    EXPECT_EQ(check_epochs(run, n), "");
  }
  EXPECT_GT(forged.load(), 1000u);
  EXPECT_NE(server.err().find("that it does not hold"), std::string::npos)
      << "the server never refused a forged release: did the forger reach it?\n"
      << server.err();
  EXPECT_EQ(server.wait(10), 0) << server.err();
  EXPECT_FALSE(file_exists("/dev/shm/" + segment_name_for(ep)));
}

}  // namespace
}  // namespace batchcast::testing
