//! A tiny blocking HTTP/1.1 client over `TcpStream`, one connection per request, for the
//! benches' setup and checks (creating waitpoints, enrolling devices, reading counts,
//! probing webhook). Never on a measured path.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, bail};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A response: the status code and the (de-chunked) body.
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; `what` names the request in the error.
    pub fn json(&self, what: &str) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("{what}: the answer is not JSON: {}", self.text()))
    }
}

/// Sends one request with `Connection: close` and reads the whole answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&[u8]>,
) -> anyhow::Result<Reply> {
    let what = || format!("{method} http://{addr}{path}");
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).with_context(what)?;
    stream.set_read_timeout(Some(TIMEOUT)).with_context(what)?;
    stream.set_write_timeout(Some(TIMEOUT)).with_context(what)?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = bearer {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.unwrap_or_default());
    stream.write_all(&out).with_context(what)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).with_context(what)?;
    parse(&raw).with_context(what)
}

fn parse(raw: &[u8]) -> anyhow::Result<Reply> {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("the answer has no complete header ({} bytes)", raw.len());
    };
    let head = String::from_utf8_lossy(&raw[..end]);
    let rest = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().context("bad content-length")?);
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.eq_ignore_ascii_case("chunked")
        {
            chunked = true;
        }
    }
    let body = if chunked {
        dechunk(rest)?
    } else {
        match length {
            Some(n) if n <= rest.len() => rest[..n].to_vec(),
            Some(n) => bail!("the body is short: {} of {n} bytes", rest.len()),
            None => rest.to_vec(),
        }
    };
    Ok(Reply { status, body })
}

fn dechunk(mut rest: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            bail!("a chunk size line is cut short");
        };
        let size_text = String::from_utf8_lossy(&rest[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .with_context(|| format!("bad chunk size {size_hex:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        if rest.len() < size + 2 {
            bail!("a chunk is cut short");
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_length_and_chunked_bodies() -> anyhow::Result<()> {
        let r = parse(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}")?;
        assert_eq!((r.status, r.body.as_slice()), (201, b"{}".as_slice()));
        let r = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")?;
        assert_eq!((r.status, r.body.as_slice()), (200, b"abcde".as_slice()));
        Ok(())
    }
}
