use super::*;

fn parse(bytes: &[u8], head_request: bool) -> Result<Parsed, FramingError> {
    parse_head(
        &mut BytesMut::from(bytes),
        head_request,
        &mut HeaderMap::new(),
        &mut FieldSpans::default(),
    )
}

/// The final head at the start of `text`, its fields, and what is left after it.
fn final_head(text: &str, head_request: bool) -> (ResponseHead, HeaderMap, BytesMut) {
    let mut buffer = BytesMut::from(text.as_bytes());
    // A map that held a request's fields: they must all be replaced.
    let mut headers = HeaderMap::new();
    headers.insert("x-request-field", HeaderValue::from_static("stale"));
    match parse_head(
        &mut buffer,
        head_request,
        &mut headers,
        &mut FieldSpans::default(),
    ) {
        Ok(Parsed::Final(head)) => {
            assert!(headers.get("x-request-field").is_none(), "{headers:?}");
            (head, headers, buffer)
        }
        other => panic!("{text:?}: expected a final head, got {other:?}"),
    }
}

fn framing_of(text: &str) -> (Framing, bool) {
    let (head, _, _) = final_head(text, false);
    (head.framing, head.reusable)
}

/// What a whole body decoded to: data, trailers, whether it ended, what is left in the buffer.
type Decoding = (Vec<u8>, Option<HeaderMap>, bool, Vec<u8>);

/// Decodes all of `wire` fed `step` bytes at a time.
fn decode_all(framing: Framing, wire: &[u8], step: usize) -> Result<Decoding, FramingError> {
    let mut decoder = BodyDecoder::new(framing);
    let mut buffer = BytesMut::new();
    let mut fed = 0;
    let mut data = Vec::new();
    let mut trailers = None;
    loop {
        match decoder.decode(&mut buffer)? {
            Decoded::Data(bytes) => data.extend_from_slice(&bytes),
            Decoded::Trailers(map) => trailers = Some(map),
            Decoded::End => return Ok((data, trailers, true, buffer.to_vec())),
            Decoded::NeedMore => {
                if fed >= wire.len() {
                    return match decoder.at_eof()? {
                        Decoded::End => Ok((data, trailers, true, buffer.to_vec())),
                        other => panic!("at_eof gave {other:?}"),
                    };
                }
                let next = (fed + step).min(wire.len());
                buffer.extend_from_slice(&wire[fed..next]);
                fed = next;
            }
        }
    }
}

#[test]
fn content_length_frames_the_body_and_keeps_the_connection() {
    let (head, headers, rest) = final_head(
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello",
        false,
    );
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.framing, Framing::Length(5));
    assert!(head.reusable);
    assert_eq!(&rest[..], b"hello");
    assert_eq!(headers.get_all("x-a").iter().count(), 2);
    assert_eq!(headers["content-length"], "5");
}

#[test]
fn a_head_split_anywhere_is_partial_until_complete() {
    let text = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    for cut in 0..text.len() {
        let mut buffer = BytesMut::from(&text[..cut]);
        assert!(
            matches!(
                parse_head(
                    &mut buffer,
                    false,
                    &mut HeaderMap::new(),
                    &mut FieldSpans::default()
                ),
                Ok(Parsed::Partial)
            ),
            "cut at {cut}"
        );
        // Nothing taken from an incomplete head.
        assert_eq!(buffer.len(), cut);
    }
    assert!(matches!(parse(text, false), Ok(Parsed::Final(_))));
}

#[test]
fn bodiless_answers_have_no_body_whatever_their_length_says() {
    let (head, headers, _) = final_head("HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n", true);
    assert_eq!(head.framing, Framing::Empty);
    assert!(head.reusable);
    // The length of the resource stays for the client.
    assert_eq!(headers["content-length"], "42");
    for status in [204, 304] {
        let (framing, reusable) = framing_of(&format!(
            "HTTP/1.1 {status} X\r\nContent-Length: 42\r\n\r\n"
        ));
        assert_eq!(framing, Framing::Empty, "{status}");
        assert!(reusable);
    }
}

#[test]
fn transfer_encoding_decides_the_framing() {
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
        (Framing::Chunked, true)
    );
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n"),
        (Framing::Chunked, true)
    );
    // The last coding is not chunked: the body ends with the connection.
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
        (Framing::UntilClose, false)
    );
    // With a Content-Length too: chunked wins, the length is dropped, the connection is not
    // used again.
    let (head, headers, _) = final_head(
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        false,
    );
    assert_eq!(head.framing, Framing::Chunked);
    assert!(!head.reusable);
    assert!(headers.get("content-length").is_none());
    assert_eq!(
        parse(
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            false
        )
        .err(),
        Some(FramingError::TransferEncodingInHttp10)
    );
}

#[test]
fn content_length_values_must_agree_and_be_decimal() {
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nContent-Length: 7\r\n\r\n"),
        (Framing::Length(7), true)
    );
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\n\r\n"),
        (Framing::Length(7), true)
    );
    for bad in [
        "Content-Length: 7\r\nContent-Length: 8",
        "Content-Length: 7, 8",
        "Content-Length: -1",
        "Content-Length: +7",
        "Content-Length: 0x10",
        "Content-Length: ",
        "Content-Length: 99999999999999999999",
    ] {
        let text = format!("HTTP/1.1 200 OK\r\n{bad}\r\n\r\n");
        assert_eq!(
            parse(text.as_bytes(), false).err(),
            Some(FramingError::ContentLength),
            "{bad}"
        );
    }
}

#[test]
fn connection_persistence_follows_the_version_and_connection_header() {
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"),
        (Framing::Length(0), false)
    );
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nConnection: foo, Close\r\nContent-Length: 0\r\n\r\n"),
        (Framing::Length(0), false)
    );
    assert_eq!(
        framing_of("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"),
        (Framing::Length(0), false)
    );
    assert_eq!(
        framing_of("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"),
        (Framing::Length(0), true)
    );
    // No length at all: the body runs to the close.
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\n\r\n"),
        (Framing::UntilClose, false)
    );
}

#[test]
fn interim_answers_are_skipped_and_101_is_refused() {
    let mut buffer = BytesMut::from(
        &b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nNEXT"[..],
    );
    assert!(matches!(
        parse_head(
            &mut buffer,
            false,
            &mut HeaderMap::new(),
            &mut FieldSpans::default()
        ),
        Ok(Parsed::Interim)
    ));
    assert!(matches!(
        parse_head(
            &mut buffer,
            false,
            &mut HeaderMap::new(),
            &mut FieldSpans::default()
        ),
        Ok(Parsed::Interim)
    ));
    assert_eq!(&buffer[..], b"NEXT");
    assert_eq!(
        parse(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", false).err(),
        Some(FramingError::UnexpectedUpgrade)
    );
}

#[test]
fn malformed_and_oversized_heads_are_errors() {
    assert!(matches!(
        parse(b"HTTP/1.1 2000 OK\r\n\r\n", false),
        Err(FramingError::Head(_))
    ));
    assert!(matches!(
        parse(b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", false),
        Err(FramingError::Head(_))
    ));
    let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
    assert!(matches!(
        parse(format!("HTTP/1.1 200 OK\r\n{many}\r\n").as_bytes(), false),
        Err(FramingError::Head(httparse::Error::TooManyHeaders))
    ));
    // Complete, but past the bound.
    let large = format!(
        "HTTP/1.1 200 OK\r\nX: {}\r\nContent-Length: 0\r\n\r\n",
        "a".repeat(MAX_HEAD_BYTES)
    );
    assert_eq!(
        parse(large.as_bytes(), false).err(),
        Some(FramingError::HeadTooLarge)
    );
    let endless = format!("HTTP/1.1 200 OK\r\nX: {}", "a".repeat(MAX_HEAD_BYTES));
    assert_eq!(
        parse(endless.as_bytes(), false).err(),
        Some(FramingError::HeadTooLarge)
    );
}

#[test]
fn a_length_body_leaves_what_follows_it() {
    for step in [1, 3, 1000] {
        let (data, trailers, ended, left) =
            decode_all(Framing::Length(5), b"helloHTTP/1.1", step).expect("decodes");
        assert_eq!(data, b"hello", "step {step}");
        assert!(trailers.is_none() && ended);
        // With one-byte steps nothing beyond the body was fed yet.
        if step == 1000 {
            assert_eq!(left, b"HTTP/1.1");
        }
    }
    assert_eq!(
        decode_all(Framing::Length(5), b"hel", 10).err(),
        Some(FramingError::Truncated)
    );
    let empty = BodyDecoder::new(Framing::Length(0));
    assert!(empty.is_done());
    assert_eq!(empty.remaining(), Some(0));
}

#[test]
fn chunked_bodies_decode_at_any_split() {
    let wire = b"5;name=value\r\nhello\r\n6 \r\n world\r\n0\r\n\r\nNEXT";
    for step in 1..wire.len() {
        let (data, trailers, ended, left) =
            decode_all(Framing::Chunked, wire, step).expect("decodes");
        assert_eq!(data, b"hello world", "step {step}");
        assert!(trailers.is_none() && ended, "step {step}");
        assert!(b"NEXT".starts_with(&left), "step {step}: {left:?}");
    }
    let upper = b"A\r\n0123456789\r\n0\r\n\r\n";
    let (data, _, _, _) = decode_all(Framing::Chunked, upper, 4).expect("decodes");
    assert_eq!(data, b"0123456789");
}

#[test]
fn chunked_trailers_become_a_trailers_frame() {
    let wire = b"3\r\nabc\r\n0\r\nGrpc-Status: 0\r\nX-Digest: d\r\n\r\n";
    for step in [1, 7, 100] {
        let (data, trailers, ended, left) =
            decode_all(Framing::Chunked, wire, step).expect("decodes");
        assert_eq!(data, b"abc");
        let trailers = trailers.expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["x-digest"], "d");
        assert!(ended && left.is_empty());
    }
}

#[test]
fn broken_chunked_bodies_are_errors() {
    for (wire, error) in [
        (&b"zz\r\nab\r\n"[..], FramingError::ChunkSize),
        (b"\r\n", FramingError::ChunkSize),
        (b"-1\r\n", FramingError::ChunkSize),
        (b"1 x\r\n", FramingError::ChunkSize),
        (b"1000000000000000\r\n", FramingError::ChunkSize),
        (b"3\r\nabcXY0\r\n\r\n", FramingError::ChunkEnd),
        (
            b"3\r\nabc\r\n0\r\nBad Name: x\r\n\r\n",
            FramingError::Trailers,
        ),
        (b"3\r\nab", FramingError::Truncated),
        (b"3\r\nabc\r\n", FramingError::Truncated),
        (b"3\r\nabc\r\n0\r\nX: y\r\n", FramingError::Truncated),
    ] {
        assert_eq!(
            decode_all(Framing::Chunked, wire, 2).err(),
            Some(error.clone()),
            "{:?}",
            String::from_utf8_lossy(wire)
        );
    }
    let long_line = format!("1;{}\r\n", "e".repeat(MAX_CHUNK_LINE_BYTES));
    assert_eq!(
        decode_all(Framing::Chunked, long_line.as_bytes(), 10_000).err(),
        Some(FramingError::ChunkSize)
    );
    let endless_trailers = format!("0\r\nX: {}", "t".repeat(MAX_TRAILER_BYTES));
    assert_eq!(
        decode_all(Framing::Chunked, endless_trailers.as_bytes(), 100_000).err(),
        Some(FramingError::Trailers)
    );
}

#[test]
fn a_close_delimited_body_ends_with_the_connection() {
    let (data, trailers, ended, left) =
        decode_all(Framing::UntilClose, b"everything until close", 4).expect("decodes");
    assert_eq!(data, b"everything until close");
    assert!(trailers.is_none() && ended && left.is_empty());
    assert_eq!(BodyDecoder::new(Framing::UntilClose).remaining(), None);
}
