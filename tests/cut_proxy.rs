//! A TCP proxy the test controls, for cutting a process off a server (a hub from its
//! PostgreSQL) the way a network fault does: [`CutProxy::cut`] resets every connection
//! through it at once, both ways, and it goes on accepting new ones; [`CutProxy::down`]
//! also refuses new ones until [`CutProxy::up`] (a server unreachable). Threads and blocking
//! sockets, one pair of copiers per connection; stopped when dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running proxy from a loopback port to `upstream`.
pub struct CutProxy {
    port: u16,
    inner: Arc<Inner>,
}

struct Inner {
    upstream: SocketAddr,
    /// Both ends of every connection passed on, until cut.
    open: Mutex<Vec<(TcpStream, TcpStream)>>,
    stop: AtomicBool,
    /// New connections are closed at once.
    down: AtomicBool,
    cuts: AtomicUsize,
}

impl CutProxy {
    /// Listens on a free loopback port, passing each connection on to `upstream`.
    pub fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let inner = Arc::new(Inner {
            upstream,
            open: Mutex::default(),
            stop: AtomicBool::new(false),
            down: AtomicBool::new(false),
            cuts: AtomicUsize::new(0),
        });
        let i = inner.clone();
        std::thread::Builder::new()
            .name("cut-proxy".into())
            .spawn(move || accept(listener, i))
            .expect("the proxy's thread");
        CutProxy { port, inner }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Resets every connection through the proxy now (clients and the server each see
    /// theirs end); new connections are passed on as before. Returns how many were made
    /// since the last cut (some may have ended by themselves already).
    pub fn cut(&self) -> usize {
        let open = std::mem::take(&mut *self.inner.open.lock().unwrap_or_else(|e| e.into_inner()));
        for (a, b) in &open {
            // A zero linger makes the close a reset, as a fault in between would.
            for s in [a, b] {
                let _ = rustix::net::sockopt::set_socket_linger(s, Some(Duration::ZERO));
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        self.inner.cuts.fetch_add(1, Ordering::Relaxed);
        open.len()
    }

    /// Cuts every connection and refuses new ones until [`CutProxy::up`].
    pub fn down(&self) {
        self.inner.down.store(true, Ordering::Relaxed);
        self.cut();
    }

    /// Passes new connections on again.
    pub fn up(&self) {
        self.inner.down.store(false, Ordering::Relaxed);
    }

    /// Connections passed on since the last cut.
    pub fn open(&self) -> usize {
        self.inner
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        self.cut();
    }
}

fn accept(listener: TcpListener, inner: Arc<Inner>) {
    for conn in listener.incoming() {
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(client) = conn else { continue };
        if inner.down.load(Ordering::Relaxed) {
            let _ = rustix::net::sockopt::set_socket_linger(&client, Some(Duration::ZERO));
            drop(client);
            continue;
        }
        let Ok(server) = TcpStream::connect_timeout(&inner.upstream, Duration::from_secs(5)) else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        inner
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((c3, s3));
        std::thread::spawn(move || copy(client, s2));
        std::thread::spawn(move || copy(server, c2));
    }
}

/// Copies `from` to `to` until either ends, then ends both.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pass_both_ways_and_a_cut_ends_the_connection_but_not_the_proxy() {
        let server = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = server.local_addr().expect("addr");
        std::thread::spawn(move || {
            for s in server.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let proxy = CutProxy::start(addr);
        let echo = |c: &mut TcpStream, what: &[u8]| -> std::io::Result<Vec<u8>> {
            c.write_all(what)?;
            let mut got = vec![0u8; what.len()];
            c.read_exact(&mut got)?;
            Ok(got)
        };
        let mut c = TcpStream::connect(("127.0.0.1", proxy.port())).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(echo(&mut c, b"hello").expect("echo"), b"hello");
        assert_eq!(proxy.open(), 1);
        assert_eq!(proxy.cut(), 1);
        let after = echo(&mut c, b"again");
        assert!(after.is_err() || after.is_ok_and(|g| g != b"again"), "cut");
        let mut d = TcpStream::connect(("127.0.0.1", proxy.port())).expect("connect again");
        d.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(echo(&mut d, b"still").expect("echo"), b"still");
        // Down: what is open ends, and what comes is closed at once; up: passed again.
        proxy.down();
        let mut e = TcpStream::connect(("127.0.0.1", proxy.port())).expect("connect while down");
        e.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert!(echo(&mut e, b"no").is_err(), "refused while down");
        proxy.up();
        let mut f = TcpStream::connect(("127.0.0.1", proxy.port())).expect("connect when up");
        f.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(echo(&mut f, b"back").expect("echo"), b"back");
    }
}
