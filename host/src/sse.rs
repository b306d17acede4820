//! Reading a server-sent event stream (the WHATWG `text/event-stream` format) as it
//! arrives: bytes in, split anywhere (inside a line, between `\r` and `\n`, inside a UTF-8
//! character), whole messages out. It knows nothing of cortex's events. The CLI reads the
//! hub's session events with it, the hub a model server's answer.

/// One dispatched message: its `event:` name (`message` when none was given), its `id:`
/// if the message carried one, and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    /// One line, or one message's data, grew past the cap: not a stream this client reads.
    #[error("an event of more than {max} bytes in the stream")]
    TooLarge { max: usize },
}

/// The incremental parser. Feed it bytes with [`Parser::feed`]; it keeps what is not yet
/// a whole line.
#[derive(Debug)]
pub struct Parser {
    max: usize,
    line: Vec<u8>,
    /// The last byte fed ended a line with `\r`: a `\n` that follows belongs to it.
    after_cr: bool,
    /// Nothing fed yet: a byte-order mark there is dropped.
    at_start: bool,
    event: String,
    id: Option<String>,
    data: String,
    has_data: bool,
}

impl Parser {
    /// A parser that refuses a line or a message larger than `max` bytes.
    pub fn new(max: usize) -> Parser {
        Parser {
            max,
            line: Vec::new(),
            after_cr: false,
            at_start: true,
            event: String::new(),
            id: None,
            data: String::new(),
            has_data: false,
        }
    }

    /// Takes the next bytes of the stream; returns the messages they completed, in order.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<Vec<Message>, SseError> {
        let mut out = Vec::new();
        if self.at_start && !bytes.is_empty() {
            self.line.extend_from_slice(bytes);
            let bom = "\u{feff}".as_bytes();
            if self.line.len() < bom.len() && bom.starts_with(&self.line) {
                return Ok(out);
            }
            let pending = std::mem::take(&mut self.line);
            let rest = pending.strip_prefix(bom).unwrap_or(&pending);
            self.at_start = false;
            self.feed_lines(rest, &mut out)?;
            return Ok(out);
        }
        if self.after_cr && bytes.first() == Some(&b'\n') {
            bytes = &bytes[1..];
        }
        self.after_cr = false;
        self.feed_lines(bytes, &mut out)?;
        Ok(out)
    }

    /// The stream ended: a last line without its end, and a last message without its
    /// blank line, are still delivered (some servers close without them).
    pub fn finish(&mut self) -> Result<Vec<Message>, SseError> {
        let mut out = Vec::new();
        let pending = std::mem::take(&mut self.line);
        let line = if self.at_start {
            self.at_start = false;
            pending
                .strip_prefix("\u{feff}".as_bytes())
                .unwrap_or(&pending)
                .to_vec()
        } else {
            pending
        };
        if !line.is_empty()
            && let Some(m) = self.line_done(&line)?
        {
            out.push(m);
        }
        out.extend(self.dispatch());
        Ok(out)
    }

    fn feed_lines(&mut self, bytes: &[u8], out: &mut Vec<Message>) -> Result<(), SseError> {
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            self.push(&rest[..i])?;
            let line = std::mem::take(&mut self.line);
            if let Some(m) = self.line_done(&line)? {
                out.push(m);
            }
            let cr = rest[i] == b'\r';
            rest = &rest[i + 1..];
            if cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.push(rest)
    }

    fn push(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > self.max {
            return Err(SseError::TooLarge { max: self.max });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// One whole line: a field, a comment, or (empty) the end of a message.
    fn line_done(&mut self, line: &[u8]) -> Result<Option<Message>, SseError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line[0] == b':' {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (text.as_ref(), ""),
        };
        match field {
            "event" => self.event = value.to_string(),
            "data" => {
                if self.data.len() + value.len() + 1 > self.max {
                    return Err(SseError::TooLarge { max: self.max });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            // An id with a NUL is ignored, as the format says.
            "id" if !value.contains('\0') => self.id = Some(value.to_string()),
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<Message> {
        let event = std::mem::take(&mut self.event);
        let id = self.id.take();
        let data = std::mem::take(&mut self.data);
        if !std::mem::replace(&mut self.has_data, false) {
            return None;
        }
        Some(Message {
            event: if event.is_empty() {
                "message".to_string()
            } else {
                event
            },
            id,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_at_once(text: &str) -> Vec<Message> {
        Parser::new(1 << 20).feed(text.as_bytes()).expect("parses")
    }

    /// Every way of cutting `text` into two pieces gives the same messages as one piece.
    fn same_when_split(text: &str) -> Vec<Message> {
        let whole = all_at_once(text);
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let mut p = Parser::new(1 << 20);
            let mut got = p.feed(&bytes[..cut]).expect("first piece");
            got.extend(p.feed(&bytes[cut..]).expect("second piece"));
            assert_eq!(got, whole, "cut at byte {cut} of {text:?}");
        }
        let mut p = Parser::new(1 << 20);
        let mut got = Vec::new();
        for b in bytes {
            got.extend(p.feed(std::slice::from_ref(b)).expect("a byte"));
        }
        assert_eq!(got, whole, "byte by byte");
        whole
    }

    #[test]
    fn fields_comments_and_line_endings() {
        let text = "\u{feff}: keep-alive\r\nevent: event\rid: 7\r\ndata: {\"a\":\r\ndata:1}\n\n\
                    event:live\ndata: é ☃\n\n: only a comment\n\n";
        let got = same_when_split(text);
        assert_eq!(
            got,
            vec![
                Message {
                    event: "event".into(),
                    id: Some("7".into()),
                    data: "{\"a\":\n1}".into(),
                },
                Message {
                    event: "live".into(),
                    id: None,
                    data: "é ☃".into(),
                },
            ]
        );
    }

    #[test]
    fn a_message_without_data_is_not_dispatched_and_the_default_name_is_message() {
        let got = same_when_split("event: x\nid: 3\n\ndata\n\n");
        assert_eq!(
            got,
            vec![Message {
                event: "message".into(),
                id: None,
                data: String::new(),
            }]
        );
    }

    #[test]
    fn an_unfinished_message_waits() {
        let mut p = Parser::new(1 << 20);
        assert!(p.feed(b"data: 1\n").expect("ok").is_empty());
        assert_eq!(p.feed(b"\n").expect("ok").len(), 1);
    }

    #[test]
    fn an_oversized_line_is_refused() {
        let mut p = Parser::new(16);
        assert!(p.feed(b"data: 0123456").is_ok());
        assert_eq!(
            p.feed(b"789abcdef"),
            Err(SseError::TooLarge { max: 16 }),
            "no end of line within the cap"
        );
        let mut p = Parser::new(16);
        let r = p.feed(b"data: 0123456789\ndata: 0123456789\n");
        assert_eq!(r, Err(SseError::TooLarge { max: 16 }), "data over the cap");
    }

    // As a model server's stream is read: the data of each message, the stream closed.

    fn datas(p: &mut Parser, bytes: &[u8], out: &mut Vec<String>) {
        out.extend(p.feed(bytes).expect("feed").into_iter().map(|m| m.data));
    }

    fn to_end(p: &mut Parser, out: &mut Vec<String>) {
        out.extend(p.finish().expect("finish").into_iter().map(|m| m.data));
    }

    fn stream_at_once(input: &[u8]) -> Vec<String> {
        let mut p = Parser::new(1 << 20);
        let mut out = Vec::new();
        datas(&mut p, input, &mut out);
        to_end(&mut p, &mut out);
        out
    }

    fn stream_byte_by_byte(input: &[u8]) -> Vec<String> {
        let mut p = Parser::new(1 << 20);
        let mut out = Vec::new();
        for b in input {
            datas(&mut p, std::slice::from_ref(b), &mut out);
        }
        to_end(&mut p, &mut out);
        out
    }

    /// Every split of `input` into two pieces, and byte by byte, decodes alike.
    fn same_however_split(input: &[u8]) -> Vec<String> {
        let whole = stream_at_once(input);
        assert_eq!(stream_byte_by_byte(input), whole);
        for cut in 0..=input.len() {
            let mut p = Parser::new(1 << 20);
            let mut out = Vec::new();
            datas(&mut p, &input[..cut], &mut out);
            datas(&mut p, &input[cut..], &mut out);
            to_end(&mut p, &mut out);
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
    fn a_leading_byte_order_mark_is_dropped_before_a_stream_ends() {
        assert_eq!(same_however_split(b"\xEF\xBB\xBFdata: a\n\n"), ["a"]);
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut p = Parser::new(8 * 1024 * 1024);
        let piece = vec![b'x'; 1024 * 1024];
        let mut failed = false;
        for _ in 0..10 {
            if let Err(e) = p.feed(&piece) {
                assert!(matches!(e, SseError::TooLarge { .. }), "{e}");
                failed = true;
                break;
            }
        }
        assert!(failed);
    }
}
