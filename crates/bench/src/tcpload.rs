//! The TCP backend and clients of the forwarding benchmark.
//!
//! One request byte selects the workload (plus a length for downloads):
//! - `D` + u64 (big endian): the backend sends that many bytes and closes;
//! - `P`: echo until EOF (ping-pong);
//! - `R`: the backend answers one byte `K` and closes (short connections; the backend
//!   closes first, so TIME_WAIT stays on the servers' side and client ports do not run out).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHUNK: usize = 256 * 1024;

/// Serves the three workloads on `port` (127.0.0.1) until killed.
pub fn serve(port: u16) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let chunk: Arc<[u8]> = (0..CHUNK).map(|i| (i % 251) as u8).collect();
        loop {
            let (stream, _) = listener.accept().await?;
            let chunk = chunk.clone();
            tokio::spawn(async move {
                let _ = serve_one(stream, &chunk).await;
            });
        }
    })
}

async fn serve_one(mut stream: tokio::net::TcpStream, chunk: &[u8]) -> io::Result<()> {
    stream.set_nodelay(true)?;
    match stream.read_u8().await? {
        b'D' => {
            let mut left = stream.read_u64().await?;
            while left > 0 {
                let len = left.min(chunk.len() as u64) as usize;
                stream.write_all(&chunk[..len]).await?;
                left -= len as u64;
            }
            stream.shutdown().await
        }
        b'P' => {
            let mut buffer = [0u8; 4096];
            loop {
                let read = stream.read(&mut buffer).await?;
                if read == 0 {
                    return Ok(());
                }
                stream.write_all(&buffer[..read]).await?;
            }
        }
        b'R' => {
            stream.write_all(b"K").await?;
            stream.shutdown().await
        }
        other => Err(io::Error::other(format!("unknown request byte {other}"))),
    }
}

/// Downloads `bytes` through `address`; the time from connect to EOF.
pub fn download(address: SocketAddr, bytes: u64) -> Result<Duration> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(address).with_context(|| format!("connect {address}"))?;
    let mut request = [0u8; 9];
    request[0] = b'D';
    request[1..].copy_from_slice(&bytes.to_be_bytes());
    stream.write_all(&request)?;
    let mut buffer = vec![0u8; CHUNK];
    let mut received = 0u64;
    loop {
        let read = stream.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        received += read as u64;
    }
    if received != bytes {
        bail!("{address}: {received} of {bytes} bytes arrived");
    }
    Ok(started.elapsed())
}

/// `streams` parallel downloads of `total / streams` bytes each; the wall time of all.
pub fn parallel_download(address: SocketAddr, total: u64, streams: usize) -> Result<Duration> {
    let each = total / streams as u64;
    let barrier = Arc::new(Barrier::new(streams + 1));
    let workers: Vec<_> = (0..streams)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                download(address, each)
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    for worker in workers {
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("download thread panicked"))??;
    }
    Ok(started.elapsed())
}

/// Short connections (connect, one byte each way, close) from `clients` threads for
/// `duration`; connections per second. Any failed connection fails the run.
pub fn connection_rate(address: SocketAddr, clients: usize, duration: Duration) -> Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || -> Result<()> {
                while !stop.load(Ordering::Relaxed) {
                    short_connection(address)?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    let started = Instant::now();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let completed = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    for worker in workers {
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("connection thread panicked"))??;
    }
    if completed == 0 {
        bail!("{address}: no connection completed");
    }
    Ok(completed as f64 / elapsed.as_secs_f64())
}

fn short_connection(address: SocketAddr) -> Result<()> {
    let mut stream = TcpStream::connect(address).with_context(|| format!("connect {address}"))?;
    stream.set_nodelay(true)?;
    stream.write_all(b"R")?;
    let mut answer = Vec::with_capacity(1);
    stream.read_to_end(&mut answer)?;
    if answer != b"K" {
        bail!("{address}: short connection answered {answer:?}");
    }
    Ok(())
}

/// Round-trip times of `rounds` 64-byte ping-pongs on one connection (after a warm-up),
/// sorted.
pub fn ping_pong(address: SocketAddr, rounds: usize) -> Result<Vec<Duration>> {
    let mut stream = TcpStream::connect(address).with_context(|| format!("connect {address}"))?;
    stream.set_nodelay(true)?;
    stream.write_all(b"P")?;
    let message = [0x5au8; 64];
    let mut answer = [0u8; 64];
    let warm_up = (rounds / 10).max(10);
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..warm_up + rounds {
        let started = Instant::now();
        stream.write_all(&message)?;
        stream.read_exact(&mut answer)?;
        let elapsed = started.elapsed();
        if answer != message {
            bail!("{address}: ping-pong answer differs");
        }
        if round >= warm_up {
            samples.push(elapsed);
        }
    }
    samples.sort();
    Ok(samples)
}
