//! Password checks, bounded: argon2 costs about 19 MiB and tens of milliseconds per run by
//! design, so a flood of CONNECTs with made-up credentials must not get one run each at once
//! (400 of them took the gateway past 4 GiB when each had its own blocking thread). A fixed set
//! of worker threads runs them, each reusing one argon2 memory area for every check, so what
//! logins cost is `workers` areas however many clients try; a check that waited in the queue
//! past its deadline is not run at all, and the client hears "server busy".

use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::Block;
use tokio::sync::oneshot;

use super::PasswordFile;

/// How a password check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Login {
    Accepted,
    Refused,
    /// Not checked: the queue was full, or the check's turn came after its deadline.
    Busy,
}

struct Job {
    file: Arc<PasswordFile>,
    user: String,
    password: Vec<u8>,
    deadline: Instant,
    reply: oneshot::Sender<Login>,
}

/// The worker threads and their queue. Dropping it lets the workers finish their current check
/// and exit.
#[derive(Debug)]
pub struct LoginPool {
    queue: SyncSender<Job>,
    wait: Duration,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("user", &self.user).finish_non_exhaustive()
    }
}

impl LoginPool {
    /// `workers` threads; at most `queue` checks waiting; a check not started within `wait` of
    /// being asked is answered [`Login::Busy`].
    pub fn start(workers: usize, queue: usize, wait: Duration) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(queue);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new().name(format!("login-{i}")).spawn(move || work(&rx))?;
        }
        Ok(Self { queue: tx, wait })
    }

    /// Checks `user`'s `password` against `file`: at once when it matches that user's last good
    /// login, otherwise in turn on a worker.
    pub async fn check(&self, file: Arc<PasswordFile>, user: &str, password: &[u8]) -> Login {
        if file.verified_before(user, password) {
            return Login::Accepted;
        }
        let (reply, answer) = oneshot::channel();
        let job = Job {
            file,
            user: user.to_owned(),
            password: password.to_vec(),
            deadline: Instant::now() + self.wait,
            reply,
        };
        match self.queue.try_send(job) {
            Ok(()) => answer.await.unwrap_or(Login::Busy),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Login::Busy,
        }
    }
}

fn work(rx: &Mutex<Receiver<Job>>) {
    let mut memory: Vec<Block> = Vec::new();
    loop {
        let job = {
            let Ok(rx) = rx.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        if job.reply.is_closed() {
            // The client is gone (or its CONNECT timed out): nobody to answer.
            continue;
        }
        let outcome = if Instant::now() > job.deadline {
            Login::Busy
        } else if job.file.verify_with(&job.user, &job.password, &mut memory) {
            Login::Accepted
        } else {
            Login::Refused
        };
        let _ = job.reply.send(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(user: &str, password: &str) -> Arc<PasswordFile> {
        let hash = super::super::hash_password(password.as_bytes()).unwrap();
        Arc::new(PasswordFile::parse(&format!("{user}:{hash}\n"), std::path::Path::new("test")).unwrap())
    }

    #[tokio::test]
    async fn checks_run_in_turn_and_a_full_queue_is_busy() {
        let pool = LoginPool::start(1, 1, Duration::from_secs(30)).unwrap();
        let f = file("alice", "secret");
        assert_eq!(pool.check(f.clone(), "alice", b"secret").await, Login::Accepted);
        assert_eq!(pool.check(f.clone(), "alice", b"wrong").await, Login::Refused);
        assert_eq!(pool.check(f.clone(), "mallory", b"secret").await, Login::Refused);
        // One worker, one queue slot: of many checks asked at once, some are turned away at
        // once rather than all queued.
        let many = (0..6).map(|i| {
            let f = f.clone();
            let pool = &pool;
            async move { pool.check(f, "bob", format!("guess-{i}").as_bytes()).await }
        });
        let outcomes = futures_util::future::join_all(many).await;
        assert!(outcomes.contains(&Login::Busy), "{outcomes:?}");
        assert!(!outcomes.contains(&Login::Accepted), "{outcomes:?}");
    }

    #[tokio::test]
    async fn a_check_whose_turn_comes_after_its_deadline_is_not_run() {
        let pool = LoginPool::start(1, 8, Duration::ZERO).unwrap();
        let f = file("alice", "secret");
        // Not cached yet: it has to queue, and its deadline has passed by the time a worker
        // takes it.
        assert_eq!(pool.check(f.clone(), "alice", b"secret").await, Login::Busy);
    }
}
