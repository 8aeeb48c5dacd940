//! The real `tailnet-agent` binary against a scripted HTTP/1.1 backend that answers with every
//! response framing RFC 9112 allows (Content-Length, chunked with extensions and trailers,
//! close-delimited, HEAD, 204, 304, interim 1xx, `Connection: close`) and with broken ones
//! (conflicting lengths, both framings, oversized heads, truncated bodies, a connection
//! closed under an idle keep-alive). Each answer is fetched twice through the agent: as a
//! client connection's first request (the route's pooled hyper client) and as a later one
//! (the client connection's own backend connection, `src/dedicated.rs`); the client must see
//! the same answer both ways, and the backend's log shows which connection served what, so
//! the tests see when the agent reuses a backend connection and when it must not.
//! Runs in a network namespace (needs root).

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use common::{Agent, Pki, eventually, tls_connect};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HTTPS_PORT: u16 = 8443;
const BACKEND_PORT: u16 = 18090;
const HOST: &str = "framing.test";

/// One request as the scripted backend saw it.
#[derive(Clone, Debug)]
struct Served {
    connection: usize,
    method: String,
    target: String,
    /// False: the backend closed the connection instead of answering.
    answered: bool,
}

#[derive(Clone, Default)]
struct BackendLog {
    served: Arc<Mutex<Vec<Served>>>,
    closed: Arc<Mutex<Vec<usize>>>,
}

impl BackendLog {
    fn served(&self) -> Vec<Served> {
        self.served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn closed(&self, connection: usize) -> bool {
        self.closed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&connection)
    }

    /// The requests for `target` since `from` (an index into the log).
    fn for_target(&self, from: usize, target: &str) -> Vec<Served> {
        self.served()
            .into_iter()
            .skip(from)
            .filter(|served| served.target == target)
            .collect()
    }
}

/// What the backend does with the connection after an answer.
enum After {
    KeepOpen,
    Close,
    /// Close after a moment of idleness (a backend's keep-alive timeout).
    CloseWhenIdle,
    /// Read the next request and close without answering.
    DropNextRequest,
}

/// The answer bytes for `/case/<name>`.
fn script(case: &str, method: &str) -> (Vec<u8>, After) {
    let text = |answer: &str, after| (answer.as_bytes().to_vec(), after);
    match case {
        "length" => text(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            After::KeepOpen,
        ),
        "chunked" => text(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6 \r\n world\r\n0\r\n\r\n",
            After::KeepOpen,
        ),
        "trailers" => text(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-checksum\r\n\r\n3\r\nabc\r\n0\r\nx-checksum: 900150983cd24fb0\r\n\r\n",
            After::KeepOpen,
        ),
        "close-delimited" => text("HTTP/1.1 200 OK\r\n\r\nuntil the close", After::Close),
        "head" if method == "HEAD" => text(
            "HTTP/1.1 200 OK\r\nContent-Length: 42\r\nETag: \"v1\"\r\n\r\n",
            After::KeepOpen,
        ),
        "no-content" => text(
            "HTTP/1.1 204 No Content\r\nX-Done: yes\r\n\r\n",
            After::KeepOpen,
        ),
        "not-modified" => text(
            "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 42\r\n\r\n",
            After::KeepOpen,
        ),
        "early-hints" => text(
            "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            After::KeepOpen,
        ),
        "http10" => text(
            "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
            After::Close,
        ),
        "connection-close" => text(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
            After::Close,
        ),
        "both-framings" => text(
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            After::KeepOpen,
        ),
        "conflicting-lengths" => text(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
            After::KeepOpen,
        ),
        "oversized-head" => {
            let mut answer = b"HTTP/1.1 200 OK\r\n".to_vec();
            // 2 MB: far past both bounds (hyper's client checks only an incomplete head).
            for index in 0..80 {
                answer.extend_from_slice(
                    format!("x-big-{index}: {}\r\n", "v".repeat(25_000)).as_bytes(),
                );
            }
            answer.extend_from_slice(b"Content-Length: 2\r\n\r\nok");
            (answer, After::KeepOpen)
        }
        "truncated" => text(
            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            After::Close,
        ),
        "extra-bytes" => text(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged",
            After::KeepOpen,
        ),
        "idle-close" => text(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            After::CloseWhenIdle,
        ),
        "drop-next" => text(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            After::DropNextRequest,
        ),
        _ => text(
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
            After::KeepOpen,
        ),
    }
}

/// Reads one request head (the tests send no bodies); `None` when the peer closed.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<(String, String)> {
    loop {
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            buffer.drain(..end + 4);
            let mut words = head.split_whitespace();
            return Some((words.next()?.to_owned(), words.next()?.to_owned()));
        }
        let mut chunk = [0u8; 4096];
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

async fn serve_scripted(mut stream: TcpStream, connection: usize, log: BackendLog) {
    let mut buffer = Vec::new();
    let mut drop_next = false;
    while let Some((method, target)) = read_request(&mut stream, &mut buffer).await {
        let record = |answered| Served {
            connection,
            method: method.clone(),
            target: target.clone(),
            answered,
        };
        if drop_next {
            log.served
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(record(false));
            break;
        }
        log.served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(record(true));
        let case = target.strip_prefix("/case/").unwrap_or_default();
        let (answer, after) = script(case, &method);
        if stream.write_all(&answer).await.is_err() {
            break;
        }
        match after {
            After::KeepOpen => {}
            After::Close => break,
            After::CloseWhenIdle => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                break;
            }
            After::DropNextRequest => drop_next = true,
        }
    }
    drop(stream);
    log.closed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(connection);
}

async fn spawn_backend(log: BackendLog) {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, BACKEND_PORT));
    let listener = TcpListener::bind(address)
        .await
        .unwrap_or_else(|e| panic!("backend bind {address}: {e}"));
    tokio::spawn(async move {
        let mut next = 0;
        while let Ok((stream, _)) = listener.accept().await {
            next += 1;
            tokio::spawn(serve_scripted(stream, next, log.clone()));
        }
    });
}

fn start_agent() -> (Agent, Arc<Pki>) {
    let routes = json!([{"name": "framing", "hostnames": [HOST],
                         "backend": {"host": "127.0.0.1", "port": BACKEND_PORT},
                         "backendRequestTimeoutSeconds": 5}]);
    Agent::start_https("framing", HTTPS_PORT, &[HOST], routes)
}

/// An HTTP/1.1 client connection (hyper's client) to the agent over TLS.
async fn client_connection(pki: &Pki) -> SendRequest<Empty<Bytes>> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, HTTPS_PORT));
    let tls = eventually(Duration::from_secs(20), "agent listening", || async {
        tls_connect(address, HOST, pki.client_config(&[b"http/1.1"]))
            .await
            .ok()
    })
    .await;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap_or_else(|e| panic!("client handshake: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
}

/// What the client saw: status, headers (without Date), body or the body's error, trailers.
#[derive(Debug, PartialEq)]
struct Seen {
    status: StatusCode,
    headers: HeaderMap,
    body: Result<Bytes, ()>,
    trailers: Option<HeaderMap>,
}

async fn fetch(sender: &mut SendRequest<Empty<Bytes>>, method: &Method, case: &str) -> Seen {
    try_fetch(sender, method, case)
        .await
        .unwrap_or_else(|e| panic!("{method} {case}: no answer: {e}"))
}

/// `Err`: the client connection failed before a response head.
async fn try_fetch(
    sender: &mut SendRequest<Empty<Bytes>>,
    method: &Method,
    case: &str,
) -> Result<Seen, hyper::Error> {
    sender.ready().await?;
    let request = Request::builder()
        .method(method.clone())
        .uri(format!("/case/{case}"))
        .header("host", HOST)
        .header("te", "trailers")
        .body(Empty::new())
        .unwrap_or_else(|e| panic!("request: {e}"));
    let response = sender.send_request(request).await?;
    let (parts, body) = response.into_parts();
    let mut headers = parts.headers;
    headers.remove("date");
    let (body, trailers) = match body.collect().await {
        Ok(collected) => {
            let trailers = collected.trailers().cloned();
            (Ok(collected.to_bytes()), trailers)
        }
        Err(_) => (Err(()), None),
    };
    Ok(Seen {
        status: parts.status,
        headers,
        body,
        trailers,
    })
}

/// A case through the agent both ways: as a fresh client connection's first request (pooled)
/// and after a warm-up request on another one (dedicated), followed there by `GET
/// /case/length`. Returns (pooled answer, dedicated answer, whether the follow-up reused the
/// case's backend connection, the backend log from the dedicated round on).
async fn both_ways(pki: &Pki, log: &BackendLog, method: Method, case: &str) -> (Seen, Seen, bool) {
    let mut first = client_connection(pki).await;
    let pooled = fetch(&mut first, &method, case).await;

    let mut later = client_connection(pki).await;
    let before_warm_up = log.served().len();
    let warm_up = fetch(&mut later, &Method::GET, "length").await;
    assert_eq!(warm_up.status, StatusCode::OK, "{case}: warm-up");
    let warm_up_connection = log.for_target(before_warm_up, "/case/length")[0].connection;
    let before_case = log.served().len();
    let dedicated = fetch(&mut later, &method, case).await;
    let served = log.for_target(before_case, &format!("/case/{case}"));
    assert!(
        served.iter().all(|s| s.connection != warm_up_connection),
        "{case}: the later request must not share the warm-up's pooled connection: {served:?}"
    );
    if dedicated.body.is_err() {
        // The agent aborts the client connection on a broken body: no follow-up on it.
        return (pooled, dedicated, false);
    }
    let before_follow_up = log.served().len();
    let follow_up = fetch(&mut later, &Method::GET, "length").await;
    assert_eq!(
        follow_up.body,
        Ok(Bytes::from_static(b"hello")),
        "{case}: follow-up"
    );
    let follow_up_connection = log
        .for_target(before_follow_up, "/case/length")
        .last()
        .map(|s| s.connection);
    let case_connection = served.last().map(|s| s.connection);
    (pooled, dedicated, follow_up_connection == case_connection)
}

/// What a case's answer is, for the printed table.
fn script_summary(case: &str) -> &'static str {
    match case {
        "length" => "Content-Length",
        "chunked" => "chunked, a chunk extension, whitespace after a size",
        "trailers" => "chunked with a trailer field",
        "close-delimited" => "no length: the body ends with the connection",
        "head" => "HEAD answered with `Content-Length: 42` and no body",
        "no-content" => "204",
        "not-modified" => "304 with `Content-Length: 42`",
        "early-hints" => "103 and 100 before the 200",
        "http10" => "HTTP/1.0 without keep-alive",
        "connection-close" => "`Connection: close`",
        _ => "",
    }
}

fn row(input: &str, expected: &str, observed: &str) {
    println!("| {input} | {expected} | {observed} |");
}

fn expect(case: &str, seen: &Seen, status: u16, body: &[u8]) {
    // Not the whole answer in the message: some heads are hundreds of KiB.
    let head = format!("{} with {} header fields", seen.status, seen.headers.len());
    assert_eq!(seen.status.as_u16(), status, "{case}: {head}");
    assert_eq!(seen.body.as_deref(), Ok(body), "{case}: {head}");
}

#[test]
fn every_response_framing_reaches_the_client_the_same_way_pooled_and_dedicated() {
    let (agent, pki) = start_agent();
    agent.run(move || async move {
        let log = BackendLog::default();
        spawn_backend(log.clone()).await;
        // (case, method, status, body, the backend connection can carry the next request)
        let cases: [(&str, Method, u16, &[u8], bool); 10] = [
            ("length", Method::GET, 200, b"hello", true),
            ("chunked", Method::GET, 200, b"hello world", true),
            ("trailers", Method::GET, 200, b"abc", true),
            (
                "close-delimited",
                Method::GET,
                200,
                b"until the close",
                false,
            ),
            ("head", Method::HEAD, 200, b"", true),
            ("no-content", Method::GET, 204, b"", true),
            ("not-modified", Method::GET, 304, b"", true),
            ("early-hints", Method::GET, 200, b"ok", true),
            ("http10", Method::GET, 200, b"ok", false),
            ("connection-close", Method::GET, 200, b"ok", false),
        ];
        for (case, method, status, body, reusable) in cases {
            let (pooled, dedicated, reused) = both_ways(&pki, &log, method.clone(), case).await;
            expect(case, &dedicated, status, body);
            assert_eq!(
                dedicated, pooled,
                "{case}: dedicated and pooled answers differ"
            );
            assert_eq!(reused, reusable, "{case}: backend connection reuse");
            row(
                &format!("{method} `/case/{case}`: {}", script_summary(case)),
                &format!(
                    "{status}, body {:?}, backend connection reused: {reusable}",
                    String::from_utf8_lossy(body)
                ),
                &format!("as expected, reused: {reused}; the same answer as the pooled path"),
            );
        }
        let (_, trailers, _) = both_ways(&pki, &log, Method::GET, "trailers").await;
        assert_eq!(
            trailers
                .trailers
                .as_ref()
                .and_then(|t| t.get("x-checksum"))
                .map(|v| v.as_bytes()),
            Some(&b"900150983cd24fb0"[..]),
            "trailers: {trailers:?}"
        );
        let (_, head, _) = both_ways(&pki, &log, Method::HEAD, "head").await;
        assert_eq!(
            head.headers["content-length"], "42",
            "HEAD keeps the length"
        );
    });
}

#[test]
fn broken_answers_fail_one_request_and_never_poison_the_next() {
    let (agent, pki) = start_agent();
    agent.run(move || async move {
        let log = BackendLog::default();
        spawn_backend(log.clone()).await;
        // Both framings: chunked wins, the length is not passed on, the connection is not
        // reused (a possible smuggling attempt).
        let (pooled, dedicated, reused) = both_ways(&pki, &log, Method::GET, "both-framings").await;
        expect("both-framings", &dedicated, 200, b"ok");
        assert!(
            dedicated.headers.get("content-length").is_none(),
            "{dedicated:?}"
        );
        assert_eq!(dedicated, pooled);
        assert!(
            !reused,
            "a response with both framings must close its connection"
        );
        row(
            "`Content-Length: 100` + `Transfer-Encoding: chunked`, 2-byte chunked body",
            "framed by the chunks, no Content-Length passed on, connection not reused",
            "200, `ok`, chunked to the client, next request on a new connection (pooled path: the same since this change; before, it passed both on and the client waited for 100 bytes)",
        );
        // More bytes than framed: the answer is the framed one, the rest is never read as the
        // next answer (the follow-up gets its own on a new connection).
        let (pooled, dedicated, reused) = both_ways(&pki, &log, Method::GET, "extra-bytes").await;
        expect("extra-bytes", &dedicated, 200, b"ok");
        assert_eq!(dedicated, pooled);
        assert!(
            !reused,
            "bytes beyond the framed body: the connection must not be reused"
        );
        row(
            "`Content-Length: 2` body followed by a forged second response",
            "the framed answer; the rest never read as the next answer",
            "200, `ok`; the next request got its own answer on a new connection",
        );
        for case in ["conflicting-lengths", "oversized-head"] {
            let (pooled, dedicated, reused) = both_ways(&pki, &log, Method::GET, case).await;
            expect(case, &dedicated, 502, b"bad gateway\n");
            assert_eq!(dedicated.status, pooled.status, "{case}");
            assert!(!reused, "{case}");
            row(case, "502, connection not reused", "502 (pooled path too)");
        }
        // A body cut short: the client must not take it for a complete answer (hyper's
        // server aborts the client connection, before or after the head).
        let mut client = client_connection(&pki).await;
        let _ = fetch(&mut client, &Method::GET, "length").await;
        let truncated = try_fetch(&mut client, &Method::GET, "truncated").await;
        assert!(
            truncated.as_ref().map_or(true, |seen| seen.body.is_err()),
            "a truncated body must fail at the client: {truncated:?}"
        );
        assert_eq!(log.for_target(0, "/case/truncated").len(), 1);
        row(
            "`Content-Length: 10`, 3 bytes, close",
            "the client sees an error, not a complete answer",
            "client connection aborted",
        );
    });
}

#[test]
fn a_backend_connection_closed_while_idle_is_replaced_and_idempotent_requests_retried() {
    let (agent, pki) = start_agent();
    agent.run(move || async move {
        let log = BackendLog::default();
        spawn_backend(log.clone()).await;

        // The backend closes the idle connection (its keep-alive timeout) before the next
        // request: the agent sees the close and opens a new one without trying the old.
        let mut client = client_connection(&pki).await;
        let _ = fetch(&mut client, &Method::GET, "length").await;
        let seen = fetch(&mut client, &Method::GET, "idle-close").await;
        expect("idle-close", &seen, 200, b"hello");
        let idle_connection = log.for_target(0, "/case/idle-close")[0].connection;
        eventually(
            Duration::from_secs(5),
            "backend closed its idle connection",
            || async { log.closed(idle_connection).then_some(()) },
        )
        .await;
        let from = log.served().len();
        let next = fetch(&mut client, &Method::GET, "length").await;
        expect("after idle close", &next, 200, b"hello");
        let after = log.served().into_iter().skip(from).collect::<Vec<_>>();
        assert_eq!(
            after.len(),
            1,
            "one request, on a new connection: {after:?}"
        );
        assert_ne!(after[0].connection, idle_connection);
        assert!(after[0].answered);

        // The backend takes the next request and closes without answering (the race the
        // check cannot see): a GET goes again on a new connection ...
        let _ = fetch(&mut client, &Method::GET, "drop-next").await;
        let from = log.served().len();
        let retried = fetch(&mut client, &Method::GET, "length").await;
        expect("GET after a dropped request", &retried, 200, b"hello");
        let attempts = log.served().into_iter().skip(from).collect::<Vec<_>>();
        assert_eq!(attempts.len(), 2, "{attempts:?}");
        assert!(
            !attempts[0].answered && attempts[1].answered,
            "{attempts:?}"
        );
        assert_ne!(attempts[0].connection, attempts[1].connection);

        // ... a POST (not idempotent) does not: the client gets 502, the backend saw it once.
        let _ = fetch(&mut client, &Method::GET, "drop-next").await;
        let from = log.served().len();
        let post = fetch(&mut client, &Method::POST, "length").await;
        assert_eq!(post.status, StatusCode::BAD_GATEWAY, "{post:?}");
        let attempts = log.served().into_iter().skip(from).collect::<Vec<_>>();
        assert_eq!(attempts.len(), 1, "a POST is not sent twice: {attempts:?}");
        assert_eq!(attempts[0].method, "POST");
        row(
            "backend closes its idle keep-alive connection before the next request",
            "the agent notices and uses a new connection",
            "200; the backend saw one request, on a new connection",
        );
        row(
            "backend reads the next request and closes without answering: GET, then POST",
            "GET retried once on a new connection; POST (not idempotent) not resent",
            "GET 200 after 2 attempts on 2 connections; POST 502, seen once",
        );
    });
}
