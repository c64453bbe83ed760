#include "interrupt.h"

#include <atomic>
#include <csignal>

#include <unistd.h>

namespace larder::cli {

namespace {

std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the handler touches it");

void on_sigint(int) {
  if (g_interrupted.exchange(true)) _exit(130);  // the second one, before the first was handled
}

}  // namespace

void install_interrupt_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: chat's read() of the next line sees EINTR
  sigaction(SIGINT, &sa, nullptr);
}

bool interrupted() { return g_interrupted.load(); }

void clear_interrupt() { g_interrupted.store(false); }

}  // namespace larder::cli
