//! The server side of the control socket: one task per connection, so a long deploy does
//! not hold up `list` or another service's deploy.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::{Request, Response};
use crate::router::Router;

/// Requests are small; anything larger is not from our CLI.
const MAX_REQUEST_BYTES: u64 = 4 << 20;

pub struct ControlListener {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlListener {
    /// Replaces a stale socket file left by a previous run, as upstream does.
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        Ok(ControlListener {
            listener,
            path: path.to_path_buf(),
        })
    }

    pub async fn serve(self, router: Arc<Router>) {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    let router = router.clone();
                    tokio::spawn(async move { handle(stream, router).await });
                }
                Err(e) => {
                    tracing::error!(error = %e, "Failed to accept control connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

impl Drop for ControlListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn handle(mut stream: UnixStream, router: Arc<Router>) {
    let mut buf = Vec::new();
    let read = (&mut stream)
        .take(MAX_REQUEST_BYTES)
        .read_to_end(&mut buf)
        .await;
    let response = match read {
        Err(e) => Response::Error(format!("failed to read request: {e}")),
        Ok(_) => match serde_json::from_slice::<Request>(&buf) {
            Err(e) => Response::Error(format!("invalid request: {e}")),
            Ok(request) => dispatch(&router, request).await,
        },
    };
    if let Ok(body) = serde_json::to_vec(&response) {
        let _ = stream.write_all(&body).await;
    }
    let _ = stream.shutdown().await;
}

async fn dispatch(router: &Arc<Router>, request: Request) -> Response {
    let result = match request {
        Request::Deploy(args) => router.deploy(*args).await,
        Request::Remove { service } => router.remove(&service).await,
        Request::Pause {
            service,
            drain_timeout,
            pause_timeout,
        } => router.pause(&service, drain_timeout, pause_timeout).await,
        Request::Stop {
            service,
            drain_timeout,
            message,
        } => router.stop(&service, drain_timeout, message).await,
        Request::Resume { service } => router.resume(&service).await,
        Request::List => return Response::List(super::list::describe(router.services())),
    };
    match result {
        Ok(()) => Response::Ok,
        Err(e) => Response::Error(e.to_string()),
    }
}
