//! One connection type for the device mesh: a WebSocket carrying protocol's frames
//! ([`cortex_protocol::mesh::Frame`]: MessagePack, one binary message each, capped), with
//! the WebSocket limits both ends use ([`ws_config`]).
//!
//! [`Connection`] sends a frame and reads the next one, in the manner of mini-redis's
//! `Connection`; [`Connection::split`] gives a [`FrameSink`] and a [`FrameStream`] for a
//! link whose reading and writing run in separate tasks. Pings and pongs are reported as
//! [`Incoming::Alive`] (tungstenite answers a ping by itself while something reads), so a
//! reader can tell a quiet link from a dead one. Dialing, the hello, keepalive timing and
//! what a close means stay with the caller.

use cortex_protocol::mesh::{Frame, FrameError, MAX_MESSAGE_BYTES};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Bytes, Message};

/// Bytes read from the socket at a time: thousands of links share the hub's memory, and a
/// frame is usually a few hundred bytes.
const READ_BUFFER: usize = 16 * 1024;
/// Frames are gathered up to this many bytes until a flush, so a writer that feeds a burst
/// and then flushes makes one write for it.
const WRITE_BUFFER: usize = 64 * 1024;

/// The WebSocket limits of a mesh link, the same on both ends: messages and frames capped
/// at [`MAX_MESSAGE_BYTES`], a small read buffer, writes gathered until a flush, and a
/// bounded write buffer (at least the buffer plus one whole message, as tungstenite asks).
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_write_buffer_size(WRITE_BUFFER + 2 * MAX_MESSAGE_BYTES)
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES))
}

/// What arrived.
#[derive(Debug, PartialEq)]
pub enum Incoming<F> {
    Frame(F),
    /// A ping or a pong: nothing to act on, but the peer is alive.
    Alive,
    /// The peer's close frame (its code and reason, if it gave them). Nothing follows.
    Closed(Option<CloseFrame>),
}

/// Why a frame could not be read or sent.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The socket or the WebSocket layer failed (this includes a message over the caps,
    /// which tungstenite refuses before it is whole).
    #[error("{0}")]
    Ws(#[from] tungstenite::Error),
    /// A binary message that is not a frame, or a frame over the cap.
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// A text message: the mesh speaks only binary ones.
    #[error("a text message; the mesh speaks binary MessagePack frames")]
    Text,
}

/// A mesh link's WebSocket, speaking frames.
#[derive(Debug)]
pub struct Connection<S> {
    ws: WebSocketStream<S>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Wraps an upgraded WebSocket (made with [`ws_config`]).
    pub fn new(ws: WebSocketStream<S>) -> Self {
        Connection { ws }
    }

    /// Encodes `frame` and sends it, flushed. A frame over the cap is refused before
    /// anything is written.
    pub async fn send<F: Frame>(&mut self, frame: &F) -> Result<(), ConnectionError> {
        let bytes = frame.encode()?;
        self.ws.send(Message::Binary(bytes.into())).await?;
        Ok(())
    }

    /// Sends any message, flushed: a ping, a close, or (in tests) what a frame never is.
    pub async fn send_message(&mut self, m: Message) -> Result<(), ConnectionError> {
        self.ws.send(m).await?;
        Ok(())
    }

    /// The next thing the peer sent; `Ok(None)` once the connection ended (after a close,
    /// or without one). Cancel-safe: dropping the future loses nothing.
    pub async fn next<F: Frame>(&mut self) -> Result<Option<Incoming<F>>, ConnectionError> {
        incoming(self.ws.next().await)
    }

    /// Sends a ping, flushed.
    pub async fn ping(&mut self) -> Result<(), ConnectionError> {
        self.ws.send(Message::Ping(Bytes::new())).await?;
        Ok(())
    }

    /// Starts the closing handshake with `frame` (`None`: no code, no reason) and flushes.
    pub async fn close(&mut self, frame: Option<CloseFrame>) -> Result<(), ConnectionError> {
        self.ws.close(frame).await?;
        Ok(())
    }

    /// The writing and reading halves, for two tasks.
    pub fn split(self) -> (FrameSink<S>, FrameStream<S>) {
        let (sink, stream) = self.ws.split();
        (FrameSink { sink }, FrameStream { stream })
    }
}

/// The reading half of a [`Connection`].
#[derive(Debug)]
pub struct FrameStream<S> {
    stream: SplitStream<WebSocketStream<S>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> FrameStream<S> {
    /// As [`Connection::next`].
    pub async fn next<F: Frame>(&mut self) -> Result<Option<Incoming<F>>, ConnectionError> {
        incoming(self.stream.next().await)
    }
}

/// The writing half of a [`Connection`].
#[derive(Debug)]
pub struct FrameSink<S> {
    sink: SplitSink<WebSocketStream<S>, Message>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> FrameSink<S> {
    /// Queues an encoded frame (from [`Frame::encode`]) without flushing: feed a burst,
    /// then [`FrameSink::flush`] once.
    pub async fn feed(&mut self, encoded: Vec<u8>) -> Result<(), ConnectionError> {
        self.sink.feed(Message::Binary(encoded.into())).await?;
        Ok(())
    }

    /// Writes out everything queued.
    pub async fn flush(&mut self) -> Result<(), ConnectionError> {
        self.sink.flush().await?;
        Ok(())
    }

    /// Sends a ping, flushed.
    pub async fn ping(&mut self) -> Result<(), ConnectionError> {
        self.sink.send(Message::Ping(Bytes::new())).await?;
        Ok(())
    }

    /// Sends a close frame and closes the sink. Errors are dropped: the link is over
    /// either way.
    pub async fn close(&mut self, frame: Option<CloseFrame>) {
        let _ = self.sink.send(Message::Close(frame)).await;
        let _ = self.sink.close().await;
    }
}

fn incoming<F: Frame>(
    next: Option<Result<Message, tungstenite::Error>>,
) -> Result<Option<Incoming<F>>, ConnectionError> {
    match next {
        None => Ok(None),
        Some(Err(e)) => Err(e.into()),
        Some(Ok(Message::Binary(b))) => Ok(Some(Incoming::Frame(F::decode(&b)?))),
        Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {
            Ok(Some(Incoming::Alive))
        }
        Some(Ok(Message::Close(frame))) => Ok(Some(Incoming::Closed(frame))),
        Some(Ok(Message::Text(_))) => Err(ConnectionError::Text),
    }
}

#[cfg(test)]
mod tests;
