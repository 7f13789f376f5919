//! The queue between a connection's reader and its workers: bounded, and
//! waking a worker only when one waits for a job. A `Mutex<mpsc::Receiver>`
//! cost every request two hand-offs (the channel's wake, then the
//! receiver's mutex passing between the idle workers), and under
//! sequential 1 MiB reads `strace -c` counted 13 futex calls a request
//! against nbdkit's 2.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The queue was closed: no worker will take it.
    Closed,
    /// The queue holds its most jobs.
    Full,
}

pub(crate) struct JobQueue<T> {
    state: Mutex<QueueState<T>>,
    ready: Condvar,
    capacity: usize,
}

struct QueueState<T> {
    jobs: VecDeque<T>,
    /// Workers waiting in `pop`.
    waiting: usize,
    closed: bool,
}

impl<T> JobQueue<T> {
    /// A queue of at most `capacity` jobs.
    pub fn new(capacity: usize) -> Self {
        JobQueue {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                waiting: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`. Returns whether a waiting worker will take it; if
    /// not, the caller may start another worker.
    pub fn push(&self, job: T) -> Result<bool, (Refused, T)> {
        let mut state = self.lock();
        if state.closed {
            return Err((Refused::Closed, job));
        }
        if state.jobs.len() >= self.capacity {
            return Err((Refused::Full, job));
        }
        // A waiter not yet claimed by a job queued before this one.
        let idle_worker = state.waiting > state.jobs.len();
        let before = state.jobs.len();
        state.jobs.push_back(job);
        assert_eq!(state.jobs.len(), before + 1);
        if idle_worker {
            self.ready.notify_one();
        }
        Ok(idle_worker)
    }

    /// The next job, waiting for one; None once the queue is closed and
    /// empty.
    pub fn pop(&self) -> Option<T> {
        let mut state = self.lock();
        loop {
            if let Some(job) = state.jobs.pop_front() {
                return Some(job);
            }
            if state.closed {
                return None;
            }
            state.waiting += 1;
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
            assert!(state.waiting > 0, "a waiter was counted");
            state.waiting -= 1;
        }
    }

    /// Takes no more jobs; workers finish what is queued and stop.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn jobs_come_out_in_order_and_close_ends_the_workers() {
        let queue = JobQueue::new(4);
        assert_eq!(queue.push(1), Ok(false), "no worker waits yet");
        assert_eq!(queue.push(2), Ok(false));
        assert_eq!(queue.pop(), Some(1));
        queue.close();
        assert_eq!(queue.push(3), Err((Refused::Closed, 3)));
        assert_eq!(queue.pop(), Some(2), "what was queued is still run");
        assert_eq!(queue.pop(), None);
    }

    #[test]
    fn a_full_queue_refuses_instead_of_growing() {
        let queue = JobQueue::new(2);
        assert!(queue.push(1).is_ok());
        assert!(queue.push(2).is_ok());
        assert_eq!(queue.push(3), Err((Refused::Full, 3)));
        assert_eq!(queue.pop(), Some(1));
        assert!(queue.push(3).is_ok());
    }

    /// Every job pushed is run exactly once by some worker, whether it
    /// woke one or not.
    #[test]
    fn waiting_workers_take_every_job_once() {
        const JOBS: usize = 10_000;
        const WORKERS: usize = 4;
        let queue = JobQueue::new(JOBS);
        let sum = AtomicUsize::new(0);
        let ran = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..WORKERS {
                scope.spawn(|| {
                    while let Some(job) = queue.pop() {
                        sum.fetch_add(job, Ordering::SeqCst);
                        ran.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
            // Let the workers reach their wait, so pushes do wake them.
            let started = Instant::now();
            while queue.lock().waiting < WORKERS && started.elapsed() < Duration::from_secs(30) {
                std::thread::yield_now();
            }
            let mut woke = 0;
            for job in 1..=JOBS {
                if queue.push(job).expect("open and not full") {
                    woke += 1;
                }
            }
            assert!(woke > 0, "a waiting worker was told of a job");
            queue.close();
        });
        assert_eq!(ran.load(Ordering::SeqCst), JOBS);
        assert_eq!(sum.load(Ordering::SeqCst), JOBS * (JOBS + 1) / 2);
    }
}
