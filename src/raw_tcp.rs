//! Reads and writes of plain TCP sockets as bare system calls.
//!
//! tokio's `TcpStream` reads and writes through std, which calls glibc's `recv`, `send` and
//! `writev`. In a process with more than one thread glibc wraps each of them as a
//! cancellation point: an atomic compare-and-swap on the thread's cancellation state
//! before the call and another after it. A proxied request makes four of these calls
//! (client and target, a read and a write each); the wrappers were 1.1 % of the pinned
//! proxy's CPU (bench/README.md, "Seventeenth round"). We never cancel threads, so the
//! calls here go to the kernel through `syscall(2)`.
//!
//! Readiness is tokio's, as in its own `poll_read`/`poll_write`: wait for the event,
//! try the call, and take the socket as drained when the kernel says `EAGAIN` or when a
//! read or write moved fewer bytes than asked (on Linux a short read empties the receive
//! queue and a short write fills the send buffer). Without that, every next read of a
//! keep-alive connection would cost a system call that finds nothing.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// Reads what the socket has into `buf` (`Ok(0)`: the peer closed, or `buf` is empty).
fn poll_recv(
    stream: &TcpStream,
    cx: &mut Context<'_>,
    buf: &mut [std::mem::MaybeUninit<u8>],
) -> Poll<io::Result<usize>> {
    let fd = stream.as_raw_fd();
    let len = buf.len();
    let ptr = buf.as_mut_ptr().cast::<libc::c_void>();
    poll_io(stream, cx, Interest::READABLE, len, || {
        // SAFETY: `ptr` and `len` describe `buf`, writable for the call's duration;
        // the kernel writes at most `len` bytes there.
        let n = unsafe {
            libc::syscall(
                libc::SYS_recvfrom,
                fd,
                ptr,
                len,
                0,
                std::ptr::null_mut::<libc::sockaddr>(),
                std::ptr::null_mut::<libc::socklen_t>(),
            )
        };
        result(n)
    })
}

/// Writes as much of `buf` as the socket takes.
fn poll_send(stream: &TcpStream, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
    let fd = stream.as_raw_fd();
    poll_io(stream, cx, Interest::WRITABLE, buf.len(), || send(fd, buf))
}

/// Writes as much of `bufs` as the socket takes, in one call.
fn poll_send_vectored(
    stream: &TcpStream,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    let fd = stream.as_raw_fd();
    let bufs = &bufs[..bufs.len().min(IOV_MAX)];
    // What this one call is asked to move: a short write of it means a full buffer.
    let len = bufs.iter().map(|b| b.len()).sum();
    poll_io(stream, cx, Interest::WRITABLE, len, || {
        // SAFETY: an all-zero `msghdr` is valid (no address, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // `IoSlice` is ABI-compatible with `iovec` (std guarantees it on Unix).
        msg.msg_iov = bufs.as_ptr().cast_mut().cast::<libc::iovec>();
        msg.msg_iovlen = bufs.len();
        // SAFETY: `msg` points at `bufs`, readable for the call's duration.
        let n = unsafe {
            libc::syscall(
                libc::SYS_sendmsg,
                fd,
                &msg as *const libc::msghdr,
                libc::MSG_NOSIGNAL,
            )
        };
        result(n)
    })
}

/// The most slices one `sendmsg` takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is readable for the call's duration. `MSG_NOSIGNAL`, as std sends: a
    // closed peer is an `EPIPE`, not a signal.
    let n = unsafe {
        libc::syscall(
            libc::SYS_sendto,
            fd,
            buf.as_ptr().cast::<libc::c_void>(),
            buf.len(),
            libc::MSG_NOSIGNAL,
            std::ptr::null::<libc::sockaddr>(),
            0 as libc::socklen_t,
        )
    };
    result(n)
}

fn result(n: libc::c_long) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// tokio's readiness loop around one system call that moves up to `asked` bytes.
fn poll_io(
    stream: &TcpStream,
    cx: &mut Context<'_>,
    interest: Interest,
    asked: usize,
    mut call: impl FnMut() -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        if interest.is_readable() {
            ready!(stream.poll_read_ready(cx))?;
        } else {
            ready!(stream.poll_write_ready(cx))?;
        }
        // A short transfer is reported to tokio as `WouldBlock`, which is how it learns
        // that the socket is drained (or full) and clears its readiness; the count is
        // kept here and returned.
        let mut short = None;
        let done = stream.try_io(interest, || match call() {
            Ok(n) if n > 0 && n < asked => {
                short = Some(n);
                Err(io::ErrorKind::WouldBlock.into())
            }
            other => other,
        });
        match done {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => match short {
                Some(n) => return Poll::Ready(Ok(n)),
                // Spurious readiness: wait for the next event.
                None => continue,
            },
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            done => return Poll::Ready(done),
        }
    }
}

/// A plain TCP connection, borrowed, read and written through the calls above: what
/// `TcpStream::split` gives for each direction, and the module's one way in.
pub struct Half<'a>(pub &'a TcpStream);

impl AsyncRead for Half<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // SAFETY: `poll_recv` only writes into the unfilled part, and the bytes it reports
        // are initialised by the kernel before `assume_init`/`advance` below.
        let unfilled = unsafe { buf.unfilled_mut() };
        let n = ready!(poll_recv(self.0, cx, unfilled))?;
        // SAFETY: the kernel wrote `n` bytes at the start of the unfilled part.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Half<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        poll_send(self.0, cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        poll_send_vectored(self.0, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Shuts the write side down, as tokio's `WriteHalf` does.
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let fd = self.0.as_raw_fd();
        // SAFETY: a plain call on a socket we hold open.
        let rc = unsafe { libc::shutdown(fd, libc::SHUT_WR) };
        if rc < 0 {
            return Poll::Ready(Err(io::Error::last_os_error()));
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn reads_and_writes_cross_a_real_connection() {
        let (a, mut b) = pair().await;
        Half(&a).write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");

        b.write_all(b"world!").await.unwrap();
        let mut got = Vec::new();
        while got.len() < 6 {
            let mut chunk = [0u8; 16];
            let n = Half(&a).read(&mut chunk).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got, b"world!");
    }

    #[tokio::test]
    async fn a_vectored_write_sends_every_slice_in_order() {
        let (a, mut b) = pair().await;
        let parts = [
            IoSlice::new(b"GET "),
            IoSlice::new(b"/ "),
            IoSlice::new(b"HTTP/1.1"),
        ];
        let n = Half(&a).write_vectored(&parts).await.unwrap();
        assert_eq!(n, 14);
        let mut got = [0u8; 14];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"GET / HTTP/1.1");
    }

    /// After a short read the socket counts as drained: the next read waits for new bytes
    /// (it is woken by them) instead of failing or returning nothing.
    #[tokio::test]
    async fn a_read_after_a_short_read_waits_for_the_next_bytes() {
        let (a, mut b) = pair().await;
        b.write_all(b"one").await.unwrap();
        let mut chunk = [0u8; 64];
        assert_eq!(Half(&a).read(&mut chunk).await.unwrap(), 3);
        let writer = tokio::spawn(async move {
            tokio::task::yield_now().await;
            b.write_all(b"two").await.unwrap();
            b
        });
        assert_eq!(Half(&a).read(&mut chunk).await.unwrap(), 3);
        assert_eq!(&chunk[..3], b"two");
        let mut b = writer.await.unwrap();
        b.shutdown().await.unwrap();
        assert_eq!(
            Half(&a).read(&mut chunk).await.unwrap(),
            0,
            "the peer's close"
        );
    }

    #[tokio::test]
    async fn a_write_to_a_reset_connection_is_an_error_not_a_signal() {
        let (a, b) = pair().await;
        // An abortive close: the peer answers the next segment with a reset.
        b.set_zero_linger().unwrap();
        drop(b);
        let mut failed = None;
        for _ in 0..100 {
            if let Err(e) = Half(&a).write_all(&[0u8; 4096]).await {
                failed = Some(e);
                break;
            }
            tokio::task::yield_now().await;
        }
        let e = failed.expect("writes to a reset connection fail");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn shutdown_ends_the_peers_reads() {
        let (a, mut b) = pair().await;
        Half(&a).write_all(b"last").await.unwrap();
        Half(&a).shutdown().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last");
    }
}
