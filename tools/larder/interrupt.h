// interrupt.h — Ctrl-C for the interactive verbs (generate, chat): the first SIGINT only asks
// the current generation to stop (the token callback polls interrupted()), so `generate` still
// prints its statistics and `chat` returns to its prompt; a second SIGINT before the first was
// handled exits at once (130), so a long prefill or load can always be left.
#pragma once

namespace larder::cli {

void install_interrupt_handler();  // SIGINT without SA_RESTART: a blocked read() returns EINTR
bool interrupted();
void clear_interrupt();

}  // namespace larder::cli
