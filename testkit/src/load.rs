//! Continuous load on fresh connections, for the upgrade tests: each worker sends
//! `GET /` with `Connection: close` on a new connection, one after the other, and counts
//! what came back. Fresh connections are what an upgrade endangers: every one of them goes
//! through the listening socket's accept queue.

use crate::poll_until;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct Load {
    ok: AtomicU64,
    failed: AtomicU64,
    longest_us: AtomicU64,
    stop: AtomicBool,
    failures: std::sync::Mutex<Vec<String>>,
    workers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// What a finished load saw.
#[derive(Debug)]
pub struct Outcome {
    pub ok: u64,
    pub failures: Vec<String>,
    pub longest: Duration,
}

impl Load {
    /// Starts `workers` workers against `127.0.0.1:port`, asking for `host` and expecting a
    /// 200 whose body ends with `body`.
    pub fn start(port: u16, host: &str, body: &str, workers: usize) -> Arc<Load> {
        let load = Arc::new(Load {
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            longest_us: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            failures: Default::default(),
            workers: Default::default(),
        });
        let request: Arc<[u8]> =
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                .into_bytes()
                .into();
        let body: Arc<str> = body.into();
        let tasks = (0..workers)
            .map(|_| {
                let (load, request, body) = (load.clone(), request.clone(), body.clone());
                tokio::spawn(async move {
                    while !load.stop.load(Ordering::SeqCst) {
                        let started = Instant::now();
                        let outcome = one_request(port, &request, &body).await;
                        let took = started.elapsed().as_micros() as u64;
                        load.longest_us.fetch_max(took, Ordering::SeqCst);
                        match outcome {
                            Ok(()) => load.ok.fetch_add(1, Ordering::SeqCst),
                            Err(e) => {
                                load.failures.lock().unwrap().push(e);
                                load.failed.fetch_add(1, Ordering::SeqCst)
                            }
                        };
                    }
                })
            })
            .collect();
        *load.workers.lock().unwrap() = tasks;
        load
    }

    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::SeqCst)
    }

    /// Waits until `n` more requests have succeeded.
    pub async fn wait_for_more(&self, n: u64) {
        let target = self.ok() + n;
        poll_until("requests served", Duration::from_secs(60), || {
            std::future::ready((self.ok() >= target).then_some(()))
        })
        .await;
    }

    /// Stops the workers, waits for their last requests and says what they saw.
    pub async fn finish(&self) -> Outcome {
        self.stop.store(true, Ordering::SeqCst);
        let workers = std::mem::take(&mut *self.workers.lock().unwrap());
        for w in workers {
            w.await.expect("load worker");
        }
        let outcome = Outcome {
            ok: self.ok(),
            failures: self.failures.lock().unwrap().clone(),
            longest: Duration::from_micros(self.longest_us.load(Ordering::SeqCst)),
        };
        eprintln!(
            "load: {} requests, {} failed, longest {} ms",
            outcome.ok + outcome.failures.len() as u64,
            outcome.failures.len(),
            outcome.longest.as_millis()
        );
        outcome
    }
}

async fn one_request(port: u16, request: &[u8], body: &str) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(request)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&reply);
    if text.starts_with("HTTP/1.1 200") && text.trim_end().ends_with(body) {
        Ok(())
    } else {
        Err(format!("reply: {text:?}"))
    }
}
