//! The CLI side: connect, send one request, read one response.

use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::{Request, Response};

/// Sends `request` to the server at `socket`. Errors are the text printed after `Error: `.
pub async fn call(socket: &Path, request: &Request) -> Result<Response, String> {
    let mut stream = UnixStream::connect(socket).await.map_err(|e| {
        format!(
            "cannot reach the kamal-proxy server at {} ({e}); is `kamal-proxy run` running?",
            socket.display()
        )
    })?;
    let body = serde_json::to_vec(request).map_err(|e| e.to_string())?;
    stream.write_all(&body).await.map_err(|e| e.to_string())?;
    // Half-close marks the end of the request; the server answers and closes.
    stream.shutdown().await.map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .await
        .map_err(|e| format!("lost the connection to the server: {e}"))?;
    serde_json::from_slice(&reply).map_err(|e| format!("invalid reply from the server: {e}"))
}
