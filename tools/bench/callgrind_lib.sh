# Shared by the callgrind scripts (instruction_budget.sh, callgrind_profile.sh); source it.

# callgrind_thread_kind FILE: which request-path thread a per-thread callgrind file
# (`--separate-threads=yes`) is, by the loop it ran: io, engine, worker, loop (the event
# loop of a backend whose executor waits on the network: `runtime::event_loop`), or other. The
# engine's `run` is `#[inline(never)]` for this; `EngineIo::drain_submissions` (called by
# the engine thread only) names it too, should `run` ever be inlined again (it was, once,
# and the engine dropped out of the count silently).
callgrind_thread_kind() {
  if grep -qE 'IoThread::run' "$1"; then echo io
  elif grep -qE 'Engine<[^ ]*>::run|EngineIo<[^ ]*>::drain_submissions' "$1"; then echo engine
  elif grep -qE 'WorkerThread<[^ ]*>::run' "$1"; then echo worker
  elif grep -qE 'EventLoop::run' "$1"; then echo loop
  else echo other
  fi
}
