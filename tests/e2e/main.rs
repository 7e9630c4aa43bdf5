//! End-to-end tests: the real `tessera` binary on port 0, real clients over loopback.
//! One test binary for the whole workspace (build once, run many).

mod control_plane;
mod dev;
mod fuzz;
mod serve;
