//! Server-Sent Events, decoded from bytes as they arrive: lines end in `\n`, `\r\n` or
//! `\r` (a pair split across reads still counts once); a chunk may end mid-line or
//! mid-character, so bytes wait for their line's end before they are decoded; comments
//! (`: ping`), `event:`, `id:` and `retry:` lines are skipped; an event's `data:` lines
//! join with `\n` and the event ends at a blank line (or at the end of the stream: some
//! servers close without the last blank line).

use super::error::ModelError;

/// The most one event may hold; a stream that never ends its line is refused rather
/// than buffered without end.
pub const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// A decoder fed a stream's bytes in whatever pieces they came in.
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: String,
    has_data: bool,
    /// The last byte fed was `\r`: a `\n` next is the same line end.
    after_cr: bool,
    /// The first line is still to come (a byte-order mark there is dropped).
    started: bool,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; each event completed by them is pushed to `out` (its data).
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<String>) -> Result<(), ModelError> {
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            match bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(at) => {
                    self.push(&bytes[..at])?;
                    self.after_cr = bytes[at] == b'\r';
                    bytes = &bytes[at + 1..];
                    self.end_line(out)?;
                }
                None => {
                    self.push(bytes)?;
                    bytes = &[];
                }
            }
        }
        Ok(())
    }

    /// The stream ended: a last line without its end, and a last event without its
    /// blank line, are still delivered.
    pub fn finish(&mut self, out: &mut Vec<String>) -> Result<(), ModelError> {
        if !self.line.is_empty() {
            self.end_line(out)?;
        }
        self.dispatch(out);
        Ok(())
    }

    fn push(&mut self, bytes: &[u8]) -> Result<(), ModelError> {
        if self.line.len() + self.data.len() + bytes.len() > MAX_EVENT_BYTES {
            return Err(ModelError::Malformed(format!(
                "an event longer than {MAX_EVENT_BYTES} bytes"
            )));
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<String>) -> Result<(), ModelError> {
        let mut bytes = std::mem::take(&mut self.line);
        if !self.started {
            self.started = true;
            if bytes.starts_with(b"\xEF\xBB\xBF") {
                bytes.drain(..3);
            }
        }
        if bytes.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if bytes[0] == b':' {
            return Ok(());
        }
        let line = String::from_utf8_lossy(&bytes);
        let (field, value) = match line.find(':') {
            Some(at) => {
                let value = &line[at + 1..];
                (&line[..at], value.strip_prefix(' ').unwrap_or(value))
            }
            None => (&line[..], ""),
        };
        if field == "data" {
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        // `event`, `id`, `retry` and unknown fields carry nothing a chat stream needs:
        // an error comes as data, whatever the event is named.
        self.line = bytes;
        self.line.clear();
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<String>) {
        if self.has_data {
            out.push(std::mem::take(&mut self.data));
            self.has_data = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_at_once(input: &[u8]) -> Vec<String> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        d.feed(input, &mut out).expect("feed");
        d.finish(&mut out).expect("finish");
        out
    }

    fn byte_by_byte(input: &[u8]) -> Vec<String> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for b in input {
            d.feed(std::slice::from_ref(b), &mut out).expect("feed");
        }
        d.finish(&mut out).expect("finish");
        out
    }

    /// Every split of `input` into two pieces, and byte by byte, decodes alike.
    fn same_however_split(input: &[u8]) -> Vec<String> {
        let whole = all_at_once(input);
        assert_eq!(byte_by_byte(input), whole);
        for cut in 0..=input.len() {
            let mut d = SseDecoder::new();
            let mut out = Vec::new();
            d.feed(&input[..cut], &mut out).expect("feed");
            d.feed(&input[cut..], &mut out).expect("feed");
            d.finish(&mut out).expect("finish");
            assert_eq!(out, whole, "cut at {cut}");
        }
        whole
    }

    #[test]
    fn events_are_the_data_between_blank_lines() {
        let got = same_however_split(b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n");
        assert_eq!(got, ["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
    }

    #[test]
    fn crlf_and_lone_cr_end_lines_too() {
        let got = same_however_split(b"data: one\r\n\r\ndata: two\r\rdata: three\n\r\n");
        assert_eq!(got, ["one", "two", "three"]);
    }

    #[test]
    fn comments_and_other_fields_are_skipped() {
        let input = b": ping\n\nevent: message\nid: 7\nretry: 100\ndata: x\n\n: keep-alive\r\n\r\nevent: error\ndata: {\"error\":\"e\"}\n\n";
        assert_eq!(same_however_split(input), ["x", "{\"error\":\"e\"}"]);
    }

    #[test]
    fn multi_line_data_joins_with_newlines_and_the_space_is_optional() {
        let input = b"data:{\"a\":\ndata:  1}\ndata\n\n";
        assert_eq!(same_however_split(input), ["{\"a\":\n 1}\n"]);
    }

    #[test]
    fn a_character_split_across_reads_arrives_whole() {
        let input = "data: {\"content\":\"héllo ✓ 🦀\"}\n\n".as_bytes();
        assert_eq!(same_however_split(input), ["{\"content\":\"héllo ✓ 🦀\"}"]);
    }

    #[test]
    fn a_stream_closed_without_its_last_blank_line_still_delivers() {
        assert_eq!(same_however_split(b"data: a\n\ndata: b"), ["a", "b"]);
        assert_eq!(same_however_split(b"data: a\n"), ["a"]);
        assert!(same_however_split(b"").is_empty());
        assert!(same_however_split(b": only a comment\n\n").is_empty());
    }

    #[test]
    fn a_leading_byte_order_mark_is_dropped() {
        assert_eq!(same_however_split(b"\xEF\xBB\xBFdata: a\n\n"), ["a"]);
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        let piece = vec![b'x'; 1024 * 1024];
        let mut failed = false;
        for _ in 0..10 {
            if let Err(e) = d.feed(&piece, &mut out) {
                assert!(matches!(e, ModelError::Malformed(_)), "{e}");
                failed = true;
                break;
            }
        }
        assert!(failed);
    }
}
