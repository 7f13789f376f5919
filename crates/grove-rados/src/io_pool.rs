//! A fixed set of threads that run one request's per-object operations at
//! once: librados's synchronous calls are safe from many threads, and the
//! binding wraps no asynchronous ones, so parallel threads are how a
//! request spanning objects waits for one round trip instead of one each.
//! The queue is bounded: a caller waits for room.

use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

/// One operation of a request, returning its result.
pub(crate) type Op<T> = Box<dyn FnOnce() -> io::Result<T> + Send>;

pub(crate) struct IoPool {
    sender: Option<SyncSender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl IoPool {
    pub(crate) fn new(threads: usize, queue: usize) -> io::Result<IoPool> {
        let (sender, receiver) = mpsc::sync_channel::<Job>(queue);
        let receiver = Arc::new(Mutex::new(receiver));
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let receiver = Arc::clone(&receiver);
            let worker = std::thread::Builder::new()
                .name(format!("grove-rados-{i}"))
                .spawn(move || work(&receiver))?;
            workers.push(worker);
        }
        Ok(IoPool {
            sender: Some(sender),
            workers,
        })
    }

    /// Runs every op, in parallel, and returns their results in order once
    /// all have finished; the first error if any failed.
    pub(crate) fn run_all<T: Send + 'static>(&self, ops: Vec<Op<T>>) -> io::Result<Vec<T>> {
        let count = ops.len();
        let sender = self
            .sender
            .as_ref()
            .ok_or_else(|| io::Error::other("the RADOS device's I/O threads have stopped"))?;
        let (done, results) = mpsc::sync_channel(count);
        for (i, op) in ops.into_iter().enumerate() {
            let done = done.clone();
            let job: Job = Box::new(move || {
                // The caller waits for every result; a send fails only if
                // it went away, which it does not.
                let _ = done.send((i, op()));
            });
            sender
                .send(job)
                .map_err(|_| io::Error::other("the RADOS device's I/O threads have stopped"))?;
        }
        drop(done);
        let mut slots: Vec<Option<io::Result<T>>> = (0..count).map(|_| None).collect();
        for (i, result) in results.iter() {
            slots[i] = Some(result);
        }
        slots
            .into_iter()
            .map(|slot| slot.unwrap_or_else(|| Err(io::Error::other("a RADOS I/O thread died"))))
            .collect()
    }
}

fn work(receiver: &Mutex<Receiver<Job>>) {
    loop {
        let job = match receiver.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        job();
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.sender = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}
