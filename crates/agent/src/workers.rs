//! Connection threads: every accepted connection is served, from its first byte to its end,
//! by one of N single-threaded tokio runtimes (one per CPU by default), each with its own
//! epoll instance and timer wheel — the model of nginx's worker processes.
//!
//! On the multi-threaded runtime, one worker at a time owns the I/O driver and hands woken
//! tasks to the others (a futex wake-up and a steal), and every timer (hyper's header-read
//! timeout, the backend head timeout) goes through one shared wheel behind a mutex. On two
//! busy cores that shows as latency and lost throughput at many connections; a connection
//! pinned to one thread pays none of it. The accept loops, the admin listener and the probes
//! stay on the main runtime; a connection crosses threads exactly once, right after `accept`
//! (its socket moves from the main runtime's epoll to its thread's).

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio_util::task::TaskTracker;

/// The connection threads; cheap to share (`Arc`).
#[derive(Debug)]
pub struct ConnectionThreads {
    handles: Vec<Handle>,
    next: AtomicUsize,
}

impl ConnectionThreads {
    /// `count` threads (0: one per available CPU). Threads that cannot be started are left
    /// out; with none, connections run on the caller's runtime.
    pub fn start(count: usize) -> ConnectionThreads {
        let count = if count == 0 {
            std::thread::available_parallelism().map_or(1, usize::from)
        } else {
            count
        };
        let mut handles = Vec::with_capacity(count);
        for index in 0..count {
            match start_thread(index) {
                Ok(handle) => handles.push(handle),
                Err(error) => {
                    tracing::warn!(%error, index, "cannot start a connection thread");
                }
            }
        }
        ConnectionThreads {
            handles,
            next: AtomicUsize::new(0),
        }
    }

    pub fn count(&self) -> usize {
        self.handles.len()
    }

    /// Serves `stream` with `serve` on the next connection thread (round robin), tracked by
    /// `tracker` so shutdown waits for it. A socket that cannot be moved is closed.
    pub fn spawn<F, Fut>(&self, tracker: &TaskTracker, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(handle) = self.pick() else {
            tracker.spawn(serve(stream));
            return;
        };
        // Deregistered from this runtime's epoll; registered with the thread's below.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, "cannot move an accepted connection; closing it");
                return;
            }
        };
        handle.spawn(tracker.track_future(async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => serve(stream).await,
                Err(error) => {
                    tracing::debug!(%error, "cannot register an accepted connection; closing it");
                }
            }
        }));
    }

    fn pick(&self) -> Option<&Handle> {
        if self.handles.is_empty() {
            return None;
        }
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        self.handles.get(index)
    }
}

/// A thread running a current-thread runtime for as long as the process lives.
fn start_thread(index: usize) -> io::Result<Handle> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = runtime.handle().clone();
    // On this thread: the collection frees the heap of the thread that runs it.
    handle.spawn(crate::memory::release_periodically());
    std::thread::Builder::new()
        .name(format!("connections-{index}"))
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn connections_are_served_on_the_threads_and_tracked() -> io::Result<()> {
        let threads = ConnectionThreads::start(2);
        assert_eq!(threads.count(), 2);
        let tracker = TaskTracker::new();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let mut clients = Vec::new();
        for round in 0..4u8 {
            let mut client = TcpStream::connect(address).await?;
            let (accepted, _) = listener.accept().await?;
            threads.spawn(&tracker, accepted, move |mut stream| async move {
                let name = std::thread::current().name().unwrap_or_default().to_owned();
                let mut byte = [0u8; 1];
                if stream.read_exact(&mut byte).await.is_ok() {
                    let answer = format!("{}:{name}", byte[0]);
                    let _ = stream.write_all(answer.as_bytes()).await;
                }
            });
            client.write_all(&[round]).await?;
            clients.push((round, client));
        }
        let mut threads_seen = std::collections::BTreeSet::new();
        for (round, mut client) in clients {
            let mut answer = String::new();
            client.read_to_string(&mut answer).await?;
            let (echoed, thread) = answer.split_once(':').unwrap_or_default();
            assert_eq!(echoed, round.to_string());
            assert!(thread.starts_with("connections-"), "served on {thread:?}");
            threads_seen.insert(thread.to_owned());
        }
        assert_eq!(threads_seen.len(), 2, "round robin over both threads");
        tracker.close();
        tokio::time::timeout(std::time::Duration::from_secs(10), tracker.wait())
            .await
            .map_err(io::Error::other)?;
        Ok(())
    }
}
