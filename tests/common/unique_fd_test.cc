#include "common/unique_fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <catch2/catch.hpp>

using ddprun::UniqueFd;

namespace {

// A pipe whose write end is the subject: the read end sees EOF exactly when the last
// write end has been closed, whatever descriptor numbers the kernel hands out meanwhile.
struct Pipe {
  UniqueFd read_end;
  int write_end = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0);
    read_end.reset(fds[0]);
    write_end = fds[1];
  }
  bool writeEndClosed() const {
    char c;
    return ::read(read_end.get(), &c, 1) == 0;  // EOF; EAGAIN while a writer is open
  }
};

// A descriptor number nothing in this process has open.
int unusedDescriptor() {
  int fd = 1 << 20;
  while (::fcntl(fd, F_GETFD) != -1) --fd;
  return fd;
}

}  // namespace

TEST_CASE("a UniqueFd closes its descriptor when it goes", "[unique_fd]") {
  Pipe pipe;
  {
    UniqueFd owner(pipe.write_end);
    CHECK(owner.valid());
    CHECK(owner.get() == pipe.write_end);
    CHECK_FALSE(pipe.writeEndClosed());
  }
  CHECK(pipe.writeEndClosed());
}

TEST_CASE("a negative descriptor or a default UniqueFd owns nothing", "[unique_fd]") {
  UniqueFd none;
  CHECK_FALSE(none);
  CHECK(none.get() == -1);
  UniqueFd failed(-5);
  CHECK_FALSE(failed.valid());
  CHECK(failed.get() == -1);
  CHECK(failed.close() == 0);
}

TEST_CASE("release gives the descriptor up without closing it", "[unique_fd]") {
  Pipe pipe;
  int fd = -1;
  {
    UniqueFd owner(pipe.write_end);
    fd = owner.release();
    CHECK_FALSE(owner.valid());
  }
  CHECK(fd == pipe.write_end);
  CHECK_FALSE(pipe.writeEndClosed());
  UniqueFd again(fd);  // closes it at the end of the test
}

TEST_CASE("reset closes the old descriptor and owns the new one", "[unique_fd]") {
  Pipe first, second;
  UniqueFd owner(first.write_end);
  owner.reset(second.write_end);
  CHECK(first.writeEndClosed());
  CHECK_FALSE(second.writeEndClosed());
  CHECK(owner.get() == second.write_end);
  // Resetting to the descriptor already held keeps it open.
  owner.reset(second.write_end);
  CHECK_FALSE(second.writeEndClosed());
  owner.reset();
  CHECK(second.writeEndClosed());
  CHECK_FALSE(owner.valid());
}

TEST_CASE("moving a UniqueFd moves ownership and closes what the target held", "[unique_fd]") {
  Pipe first, second;
  UniqueFd a(first.write_end);
  UniqueFd b(std::move(a));
  CHECK_FALSE(a.valid());
  CHECK(b.get() == first.write_end);
  UniqueFd c(second.write_end);
  c = std::move(b);
  CHECK(second.writeEndClosed());
  CHECK_FALSE(first.writeEndClosed());
  CHECK(c.get() == first.write_end);
  UniqueFd& self = c;
  c = std::move(self);
  CHECK(c.get() == first.write_end);
  CHECK_FALSE(first.writeEndClosed());
}

TEST_CASE("closing leaves errno as the caller saw it", "[unique_fd]") {
  Pipe pipe;
  UniqueFd owner(pipe.write_end);
  errno = ENOSPC;
  owner.reset();
  CHECK(errno == ENOSPC);
  // A descriptor that close rejects (EBADF) does not change errno either.
  UniqueFd stale(unusedDescriptor());
  errno = EACCES;
  stale.reset();
  CHECK(errno == EACCES);
}

TEST_CASE("close reports the outcome of close and owns nothing afterwards", "[unique_fd]") {
  Pipe pipe;
  UniqueFd owner(pipe.write_end);
  CHECK(owner.close() == 0);
  CHECK_FALSE(owner.valid());
  CHECK(pipe.writeEndClosed());
  CHECK(owner.close() == 0);
  UniqueFd stale(unusedDescriptor());
  CHECK(stale.close() == EBADF);
  CHECK_FALSE(stale.valid());
}
