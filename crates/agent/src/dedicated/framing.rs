//! The HTTP/1.1 response framing of a dedicated backend connection, as pure functions: the
//! response head (status, headers, how the body is delimited, whether the connection can
//! carry another request) and a body decoder for Content-Length, chunked and close-delimited
//! bodies (RFC 9112 §6). No I/O: the caller reads into a buffer and hands it over.
//!
//! Bounded like hyper's client, which the pooled path uses: a head of at most
//! [`MAX_HEAD_BYTES`] with at most [`MAX_HEADERS`] fields; a chunk-size line of at most
//! [`MAX_CHUNK_LINE_BYTES`]; trailers of at most [`MAX_TRAILER_BYTES`].

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// hyper's client default read buffer bound (8 KiB + 100 × 4 KiB).
pub const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;
/// hyper's client default.
pub const MAX_HEADERS: usize = 100;
/// A chunk size with its extensions (which are ignored).
pub const MAX_CHUNK_LINE_BYTES: usize = 4096;
pub const MAX_TRAILER_BYTES: usize = 64 * 1024;
/// Interim (1xx) answers skipped before the final one.
pub const MAX_INTERIM_RESPONSES: usize = 16;

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum FramingError {
    #[error("the backend's response head is larger than {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    #[error("the backend's response head is not valid HTTP/1.x")]
    Head(#[source] httparse::Error),
    #[error("the backend's response has a header httparse accepted but HTTP does not: {name}")]
    HeaderField { name: String },
    #[error("the backend's response has an invalid or conflicting Content-Length")]
    ContentLength,
    #[error("the backend's HTTP/1.0 response has a Transfer-Encoding (faulty framing)")]
    TransferEncodingInHttp10,
    #[error("the backend switched protocols without an upgrade request")]
    UnexpectedUpgrade,
    #[error("the backend sent more than {MAX_INTERIM_RESPONSES} interim (1xx) responses")]
    TooManyInterimResponses,
    #[error("the backend's chunked body has an invalid chunk-size line")]
    ChunkSize,
    #[error("the backend's chunked body has no CRLF after a chunk's data")]
    ChunkEnd,
    #[error("the backend's trailers are larger than {MAX_TRAILER_BYTES} bytes or invalid")]
    Trailers,
    #[error("the backend closed the connection before the end of the body")]
    Truncated,
}

/// How the response body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 204, 304).
    Empty,
    Length(u64),
    Chunked,
    /// Until the backend closes the connection.
    UntilClose,
}

/// A final response head; its header fields went into the map given to [`parse_head`].
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub framing: Framing,
    /// The connection can carry the next request once the body is read.
    pub reusable: bool,
}

/// A head at the start of a buffer.
#[derive(Debug)]
pub enum Parsed {
    /// A final response; its head was taken out of the buffer.
    Final(ResponseHead),
    /// An interim (1xx other than 101) response, taken out of the buffer: skip it.
    Interim,
    /// Not complete yet: read more.
    Partial,
}

/// Parses the response head at the start of `buffer` and takes it out, for a request with
/// method HEAD when `head_request`. A final head's fields replace what `headers` held (the
/// caller hands in a map to reuse: the request's, whose capacity fits a head); their values
/// share the head's bytes (no copy). `spans` is scratch space the caller keeps between heads.
pub fn parse_head(
    buffer: &mut BytesMut,
    head_request: bool,
    headers: &mut HeaderMap,
    spans: &mut FieldSpans,
) -> Result<Parsed, FramingError> {
    // Not zeroed first (6 KiB for every response, with the spans below, when they were
    // arrays): httparse fills what it parses.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut response, buffer, &mut fields)
        .map_err(FramingError::Head)?;
    let length = match parsed {
        // Checked on a complete head too: it may have arrived in one read past the bound.
        httparse::Status::Complete(length) if length > MAX_HEAD_BYTES => {
            return Err(FramingError::HeadTooLarge);
        }
        httparse::Status::Complete(length) => length,
        httparse::Status::Partial if buffer.len() >= MAX_HEAD_BYTES => {
            return Err(FramingError::HeadTooLarge);
        }
        httparse::Status::Partial => return Ok(Parsed::Partial),
    };
    let status = StatusCode::from_u16(response.code.unwrap_or(0))
        .map_err(|_| FramingError::Head(httparse::Error::Status))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(FramingError::UnexpectedUpgrade);
    }
    if status.is_informational() {
        let _ = buffer.split_to(length);
        return Ok(Parsed::Interim);
    }
    let http10 = response.version == Some(0);
    // Where each name and value lies in the head: the head is split off the buffer (which
    // httparse's fields borrow) before the values are made from its shared bytes.
    let start = buffer.as_ptr() as usize;
    spans.0.clear();
    spans.0.extend(response.headers.iter().map(|field| {
        let name = field.name.as_ptr() as usize - start;
        let value = field.value.as_ptr() as usize - start;
        FieldSpan {
            name: (name, name + field.name.len()),
            value: (value, value + field.value.len()),
        }
    }));
    let head = buffer.split_to(length).freeze();
    headers.clear();
    let mut fields_seen = FieldsSeen::default();
    for span in &spans.0 {
        let name_bytes = &head[span.name.0..span.name.1];
        let field_error = || FramingError::HeaderField {
            name: String::from_utf8_lossy(name_bytes).into_owned(),
        };
        // Standard names are constants, others one small allocation.
        let name = HeaderName::from_bytes(name_bytes).map_err(|_| field_error())?;
        let value = HeaderValue::from_maybe_shared(head.slice(span.value.0..span.value.1))
            .map_err(|_| field_error())?;
        fields_seen.note(&name, &value)?;
        headers.append(name, value);
    }
    let framing = fields_seen.framing(status, head_request, http10)?;
    if fields_seen.transfer_encoding && framing != Framing::Empty {
        // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3); the length is not
        // passed on, so the client sees one framing only.
        headers.remove(header::CONTENT_LENGTH);
    }
    let persistent = if http10 {
        fields_seen.keep_alive && !fields_seen.close
    } else {
        !fields_seen.close
    };
    // Both framings present can be a smuggling attempt: the connection is not used again.
    let conflicting = fields_seen.transfer_encoding && fields_seen.content_length.is_some();
    let reusable = persistent && !conflicting && framing != Framing::UntilClose;
    Ok(Parsed::Final(ResponseHead {
        status,
        framing,
        reusable,
    }))
}

/// A header field's name and value as byte ranges (start, end) of the head.
#[derive(Clone, Copy, Debug)]
struct FieldSpan {
    name: (usize, usize),
    value: (usize, usize),
}

/// Where [`parse_head`] notes its fields' places; kept with the connection, so that no head
/// allocates or clears space for them.
#[derive(Debug, Default)]
pub struct FieldSpans(Vec<FieldSpan>);

/// What the framing decision needs from the header fields.
#[derive(Default)]
struct FieldsSeen {
    content_length: Option<u64>,
    transfer_encoding: bool,
    /// The last transfer coding of the last Transfer-Encoding field is `chunked`.
    chunked_last: bool,
    close: bool,
    keep_alive: bool,
}

impl FieldsSeen {
    /// RFC 9112 §6.3, for a response.
    fn framing(
        &self,
        status: StatusCode,
        head_request: bool,
        http10: bool,
    ) -> Result<Framing, FramingError> {
        if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            return Ok(Framing::Empty);
        }
        if self.transfer_encoding {
            if http10 {
                return Err(FramingError::TransferEncodingInHttp10);
            }
            return Ok(if self.chunked_last {
                Framing::Chunked
            } else {
                Framing::UntilClose
            });
        }
        Ok(match self.content_length {
            Some(length) => Framing::Length(length),
            None => Framing::UntilClose,
        })
    }

    fn note(&mut self, name: &HeaderName, value: &HeaderValue) -> Result<(), FramingError> {
        if name == header::CONTENT_LENGTH {
            // A list of identical values is one length (RFC 9110 §8.6); anything else is not.
            for item in value.as_bytes().split(|&byte| byte == b',') {
                let length = parse_decimal(item.trim_ascii()).ok_or(FramingError::ContentLength)?;
                if self.content_length.is_some_and(|seen| seen != length) {
                    return Err(FramingError::ContentLength);
                }
                self.content_length = Some(length);
            }
        } else if name == header::TRANSFER_ENCODING {
            self.transfer_encoding = true;
            let last = value
                .as_bytes()
                .split(|&byte| byte == b',')
                .map(<[u8]>::trim_ascii)
                .rfind(|coding| !coding.is_empty());
            self.chunked_last = last.is_some_and(|coding| coding.eq_ignore_ascii_case(b"chunked"));
        } else if name == header::CONNECTION {
            for token in value
                .as_bytes()
                .split(|&byte| byte == b',')
                .map(<[u8]>::trim_ascii)
            {
                self.close |= token.eq_ignore_ascii_case(b"close");
                self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        Ok(())
    }
}

/// 1 to 19 decimal digits (fits u64), nothing else.
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// What [`BodyDecoder::decode`] found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    Data(Bytes),
    Trailers(HeaderMap),
    /// The body is complete.
    End,
    /// Read more into the buffer (or call [`BodyDecoder::at_eof`] if the backend closed).
    NeedMore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Length(u64),
    UntilClose,
    ChunkSize,
    ChunkData(u64),
    ChunkDataEnd,
    Trailers,
    Done,
}

/// Takes a body's bytes out of the connection's read buffer, frame by frame; whatever
/// follows the body stays in the buffer.
#[derive(Debug)]
pub struct BodyDecoder {
    state: State,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(length) => State::Length(length),
            Framing::Chunked => State::ChunkSize,
            Framing::UntilClose => State::UntilClose,
        };
        BodyDecoder { state }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The body bytes still expected, when the framing says.
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(remaining) => Some(remaining),
            State::Done => Some(0),
            _ => None,
        }
    }

    pub fn decode(&mut self, buffer: &mut BytesMut) -> Result<Decoded, FramingError> {
        loop {
            match self.state {
                State::Done => return Ok(Decoded::End),
                State::Length(remaining) | State::ChunkData(remaining) => {
                    let Some(data) = take_data(buffer, remaining) else {
                        return Ok(Decoded::NeedMore);
                    };
                    let left = remaining - data.len() as u64;
                    self.state = match (self.state, left) {
                        (State::Length(_), 0) => State::Done,
                        (State::Length(_), _) => State::Length(left),
                        (_, 0) => State::ChunkDataEnd,
                        _ => State::ChunkData(left),
                    };
                    return Ok(Decoded::Data(data));
                }
                State::UntilClose => {
                    if buffer.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    return Ok(Decoded::Data(buffer.split().freeze()));
                }
                State::ChunkSize => {
                    let Some(size) = chunk_size_line(buffer)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::ChunkData(size)
                    };
                }
                State::ChunkDataEnd => {
                    if buffer.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if &buffer[..2] != b"\r\n" {
                        return Err(FramingError::ChunkEnd);
                    }
                    let _ = buffer.split_to(2);
                    self.state = State::ChunkSize;
                }
                State::Trailers => {
                    let Some(trailers) = trailer_section(buffer)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    self.state = State::Done;
                    return Ok(match trailers {
                        Some(trailers) => Decoded::Trailers(trailers),
                        None => Decoded::End,
                    });
                }
            }
        }
    }

    /// The backend closed the connection: the end of a close-delimited body, otherwise a
    /// truncated one.
    pub fn at_eof(&mut self) -> Result<Decoded, FramingError> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(Decoded::End)
            }
            _ => Err(FramingError::Truncated),
        }
    }
}

/// Up to `remaining` bytes from the front of the buffer; `None` when it is empty.
fn take_data(buffer: &mut BytesMut, remaining: u64) -> Option<Bytes> {
    if buffer.is_empty() {
        return None;
    }
    let take = usize::try_from(remaining)
        .unwrap_or(usize::MAX)
        .min(buffer.len());
    Some(buffer.split_to(take).freeze())
}

/// A complete `chunk-size [ chunk-ext ] CRLF` line at the front of the buffer, consumed;
/// `None` when the line is not complete yet.
fn chunk_size_line(buffer: &mut BytesMut) -> Result<Option<u64>, FramingError> {
    let window = &buffer[..buffer.len().min(MAX_CHUNK_LINE_BYTES)];
    let Some(end) = window.windows(2).position(|pair| pair == b"\r\n") else {
        if buffer.len() >= MAX_CHUNK_LINE_BYTES {
            return Err(FramingError::ChunkSize);
        }
        return Ok(None);
    };
    let line = &buffer[..end];
    let digits_end = line
        .iter()
        .position(|byte| !byte.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, rest) = line.split_at(digits_end);
    // At most 15 hex digits: the size fits u64 with room to spare.
    if digits.is_empty() || digits.len() > 15 {
        return Err(FramingError::ChunkSize);
    }
    // After the size only whitespace and extensions (`;name[=value]`), which are ignored.
    let rest = rest.trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(FramingError::ChunkSize);
    }
    if rest
        .iter()
        .any(|&byte| byte == b'\r' || byte == b'\n' || byte == 0)
    {
        return Err(FramingError::ChunkSize);
    }
    let size = std::str::from_utf8(digits)
        .ok()
        .and_then(|digits| u64::from_str_radix(digits, 16).ok())
        .ok_or(FramingError::ChunkSize)?;
    let _ = buffer.split_to(end + 2);
    Ok(Some(size))
}

/// The trailer section after the last chunk, consumed: `Some(None)` for none (just CRLF),
/// `Some(Some(fields))`, or `None` when it is not complete yet.
fn trailer_section(buffer: &mut BytesMut) -> Result<Option<Option<HeaderMap>>, FramingError> {
    if buffer.len() < 2 {
        return Ok(None);
    }
    if &buffer[..2] == b"\r\n" {
        let _ = buffer.split_to(2);
        return Ok(Some(None));
    }
    let window = &buffer[..buffer.len().min(MAX_TRAILER_BYTES)];
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (length, trailers) = match httparse::parse_headers(window, &mut fields) {
        Ok(httparse::Status::Complete((length, parsed))) => {
            let mut trailers = HeaderMap::with_capacity(parsed.len());
            for field in parsed {
                let name = HeaderName::from_bytes(field.name.as_bytes())
                    .map_err(|_| FramingError::Trailers)?;
                let value =
                    HeaderValue::from_bytes(field.value).map_err(|_| FramingError::Trailers)?;
                trailers.append(name, value);
            }
            (length, trailers)
        }
        Ok(httparse::Status::Partial) if buffer.len() < MAX_TRAILER_BYTES => return Ok(None),
        Ok(httparse::Status::Partial) | Err(_) => return Err(FramingError::Trailers),
    };
    let _ = buffer.split_to(length);
    Ok(Some(Some(trailers)))
}

#[cfg(test)]
mod tests;
