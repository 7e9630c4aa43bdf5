//! Scheduling priority of model instance threads.
//!
//! An instance thread runs executions back to back, while the async worker threads wake and
//! sleep thousands of times a second for network I/O. At equal priority each of those wake-ups
//! on the instance's core may preempt the execution in progress: at mlp batch 8, concurrency 8
//! on 2 cores, the instance thread was preempted about 1,300 times a second and its batches ran
//! half again as long as the same batches in a quiet process. With a lower nice value the
//! execution keeps its core for its slice (under 150 preemptions a second, 18–57 % more
//! throughput in the same measurements). The kernel still gives the worker threads their
//! weighted share of the CPU, so they are slowed under overload, never starved.
//!
//! Raising priority needs `CAP_SYS_NICE` (or an `RLIMIT_NICE` that allows it); without it the
//! threads keep normal priority and the server says so once.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Default nice value of instance threads (`--instance-nice`).
pub const DEFAULT_INSTANCE_NICE: i32 = -10;

/// The nice value instance threads ask for; 0 leaves them alone.
static INSTANCE_NICE: AtomicI32 = AtomicI32::new(0);
/// Whether a refusal was already logged.
static REFUSAL_LOGGED: AtomicBool = AtomicBool::new(false);

/// Sets the nice value that instance threads started from now on take (-20 to 19).
pub fn set_instance_nice(nice: i32) {
    INSTANCE_NICE.store(nice.clamp(-20, 19), Ordering::Relaxed);
}

/// The nice value instance threads take (what runner processes are started with).
pub fn instance_nice() -> i32 {
    INSTANCE_NICE.load(Ordering::Relaxed)
}

/// Called by an instance thread as it starts: gives it the configured nice value, or logs
/// (once per process) why it could not.
pub fn apply_to_instance_thread() {
    let nice = INSTANCE_NICE.load(Ordering::Relaxed);
    if nice == 0 {
        return;
    }
    if let Err(e) = set_current_thread_nice(nice)
        && !REFUSAL_LOGGED.swap(true, Ordering::Relaxed)
    {
        tracing::info!(
            nice,
            error = %e,
            "instance threads keep normal priority (a negative --instance-nice needs CAP_SYS_NICE); \
             under load, network threads will preempt executions more often"
        );
    }
}

/// Sets the calling thread's nice value (on Linux, `setpriority` with a thread ID affects only
/// that thread).
fn set_current_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid has no preconditions; setpriority only reads its arguments.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current_thread_nice() -> i32 {
        // SAFETY: as above; errno is cleared first because -1 is also a valid nice value.
        unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t)
        }
    }

    #[test]
    fn a_thread_takes_its_own_nice_value_and_leaves_the_others_alone() {
        let before = current_thread_nice();
        // A higher nice value needs no privilege, so this holds for any user.
        let inside =
            std::thread::spawn(move || set_current_thread_nice((before + 3).min(19)).map(|()| current_thread_nice()))
                .join()
                .expect("thread");
        assert_eq!(inside.expect("lowering one's own priority is always allowed"), (before + 3).min(19));
        assert_eq!(current_thread_nice(), before, "the calling thread is unchanged");
    }
}
