//! The upstream event loop (`exec::upstream::mux`) against backends that misbehave at the
//! edges: one that never answers while the server shuts down, connections the backend
//! closed while idle, a stream that stays open after `[DONE]`, `stop` set while a batch's
//! requests queue, and a base URL with a path. Raw TCP backends where the mock upstream
//! cannot misbehave that way.
use crate::common;
use crate::upstream_routing::front;
use abe::config::Millis;
use common::mock_upstream::{MockUpstream, Mode};
use common::{start, Client};
use std::time::{Duration, Instant};

#[test]
fn shutdown_with_an_upstream_request_in_flight_returns_at_the_drain_deadline() {
    let mock = MockUpstream::start();
    let mut config = front(&format!(
        r#"
        [[backends]]
        name = "slow"
        kind = "upstream"
        base_url = "{}"
        [[backends.models]]
        name = "m"
        context_length = 4096
        [upstream]
        request_timeout = "3s"
        [health]
        check_interval = "1h"
        "#,
        mock.base_url()
    ));
    config.server.shutdown_timeout = Millis(300);
    let abe = start(config);
    let probed = Instant::now();
    while mock.answered("/v1/models") == 0 {
        assert!(probed.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(10));
    }
    mock.set_mode(Mode::Hang);
    let addr = abe.local_addr();
    std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        let _ = common::post_completion(&mut c, "m", "hang");
    });
    while mock.requests("/v1/completions") == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        abe.shutdown();
        let _ = tx.send(());
    });
    let r = rx.recv_timeout(Duration::from_secs(15));
    // A hang check, not a timing: the request timeout (3 s) would end it too; before the
    // fix the loop spun and shutdown never returned.
    assert!(
        r.is_ok(),
        "shutdown did not return within 15 s ({:?})",
        t0.elapsed()
    );
}

mod raw {
    use abe::core::{Kind, Ticket};
    use abe::exec::upstream::{UpstreamClient, UpstreamExecutor, UpstreamTarget, UpstreamTimeouts};
    use abe::exec::{BatchItem, Executor, NoTokens, Work};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    const OK_BODY: &str = r#"{"choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#;

    fn client(base: String, request: Duration) -> UpstreamClient {
        UpstreamClient::new(
            UpstreamTarget {
                name: "raw".into(),
                base_url: base,
                api_key: None,
                prompt_array: false,
            },
            UpstreamTimeouts {
                connect: Duration::from_secs(2),
                request,
            },
        )
    }

    fn completion(prompt: &str) -> Work {
        Work {
            kind: Kind::Completion,
            prompt: prompt.into(),
            max_tokens: 2,
            model: Some("m".into()),
            ..Work::default()
        }
    }

    fn batch(works: Vec<Work>) -> Vec<BatchItem> {
        works
            .into_iter()
            .enumerate()
            .map(|(k, w)| {
                BatchItem::new(
                    Ticket {
                        index: k as u32,
                        generation: 1,
                    },
                    w,
                )
            })
            .collect()
    }

    /// Reads one request (head + Content-Length body) from `s`.
    fn read_request(s: &mut TcpStream) -> Option<String> {
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                while buf.len() < end + 4 + len {
                    let n = s.read(&mut tmp).ok()?;
                    if n == 0 {
                        return None;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                }
                return Some(head);
            }
            let n = s.read(&mut tmp).ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..n]);
        }
    }

    /// A chunked SSE answer up to and with `data: [DONE]`, without the body's final chunk.
    fn stream_to_done() -> String {
        let piece =
            "data: {\"choices\":[{\"index\":0,\"text\":\"hi\",\"finish_reason\":\"stop\"}]}\n\n";
        let mut out = String::from(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        for event in [piece, "data: [DONE]\n\n"] {
            out.push_str(&format!("{:x}\r\n{}\r\n", event.len(), event));
        }
        out
    }

    fn ok_response() -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
            OK_BODY.len(),
            OK_BODY
        )
        .into_bytes()
    }

    /// Two idle keep-alive connections, both closed by the backend (a restart, or its
    /// keep-alive timeout): the next request finds them closed and opens a new one.
    #[test]
    fn a_request_after_the_backend_closed_its_idle_connections_goes_on_a_new_one() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (c2, a2) = (conns.clone(), accepted.clone());
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let mut s = s.unwrap();
                let n = a2.fetch_add(1, Ordering::SeqCst);
                let c3 = c2.clone();
                std::thread::spawn(move || {
                    // The first two connections: answer one request each, hand the socket
                    // to the test (which closes them); later ones: answer everything.
                    if n < 2 {
                        read_request(&mut s).unwrap();
                        // Connection 1 answers 100 ms after connection 0.
                        std::thread::sleep(Duration::from_millis(100 * n as u64));
                        s.write_all(&ok_response()).unwrap();
                        c3.lock().unwrap().push(s);
                    } else {
                        while read_request(&mut s).is_some() {
                            s.write_all(&ok_response()).unwrap();
                        }
                    }
                });
            }
        });
        let mut exec = UpstreamExecutor::new(
            client(base, Duration::from_secs(5)),
            Arc::new(AtomicBool::new(false)),
        );
        let mut items = batch(vec![completion("a"), completion("b")]);
        exec.execute(&mut items, &mut NoTokens).unwrap();
        assert!(
            items.iter().all(|i| i.error.is_none()),
            "{:?}",
            items.iter().map(|i| &i.error).collect::<Vec<_>>()
        );
        while conns.lock().unwrap().len() < 2 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // The backend closes both idle connections, the most recently used first.
        {
            let mut c = conns.lock().unwrap();
            let last = c.pop().unwrap();
            drop(last);
            std::thread::sleep(Duration::from_millis(20));
            c.clear();
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut items = batch(vec![completion("c")]);
        exec.execute(&mut items, &mut NoTokens).unwrap();
        assert!(
            items[0].error.is_none(),
            "the request failed: {:?}",
            items[0].error
        );
    }

    /// A stream whose backend sends `data: [DONE]` and then keeps the body open (the final
    /// chunk 5 s later, past the 2 s request timeout): answered at `[DONE]`.
    #[test]
    fn a_stream_is_answered_at_done_though_its_body_stays_open() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let mut s = s.unwrap();
                std::thread::spawn(move || {
                    read_request(&mut s).unwrap();
                    s.write_all(stream_to_done().as_bytes()).unwrap();
                    // The terminating chunk comes 5 s later.
                    std::thread::sleep(Duration::from_secs(5));
                    let _ = s.write_all(b"0\r\n\r\n");
                    std::thread::sleep(Duration::from_secs(5));
                });
            }
        });
        let mut exec = UpstreamExecutor::new(
            client(base, Duration::from_secs(2)),
            Arc::new(AtomicBool::new(false)),
        );
        let mut w = completion("s");
        w.stream = true;
        let mut items = batch(vec![w]);
        exec.execute(&mut items, &mut NoTokens).unwrap();
        assert!(
            items[0].error.is_none(),
            "failed after [DONE]: {:?}",
            items[0].error
        );
    }

    /// A backend that ends a stream's body a little after `data: [DONE]` (its final chunk in
    /// a write of its own): the stream is answered at `[DONE]`, and the connection, read to
    /// the body's end, carries the next stream.
    #[test]
    fn a_stream_whose_body_ends_after_done_leaves_its_connection_reusable() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
        let counted = accepted.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let mut s = s.unwrap();
                counted.fetch_add(1, Ordering::SeqCst);
                let ended_tx = ended_tx.clone();
                std::thread::spawn(move || {
                    while read_request(&mut s).is_some() {
                        s.write_all(stream_to_done().as_bytes()).unwrap();
                        std::thread::sleep(Duration::from_millis(30));
                        s.write_all(b"0\r\n\r\n").unwrap();
                        let _ = ended_tx.send(());
                    }
                });
            }
        });
        let mut exec = UpstreamExecutor::new(
            client(base, Duration::from_secs(5)),
            Arc::new(AtomicBool::new(false)),
        );
        for round in 0..2 {
            let mut w = completion("s");
            w.stream = true;
            let mut items = batch(vec![w]);
            exec.execute(&mut items, &mut NoTokens).unwrap();
            assert!(
                items[0].error.is_none(),
                "round {round}: {:?}",
                items[0].error
            );
            ended
                .recv_timeout(Duration::from_secs(5))
                .expect("the body's end was sent");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for both"
        );
    }

    /// `stop` set while a batch of 20 requests runs: the 4 queued behind the first 16 (at
    /// most 16 of a batch go at once) are not sent.
    #[test]
    fn requests_queued_in_a_batch_are_not_sent_once_stop_is_set() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicUsize::new(0));
        let (st, rc) = (stop.clone(), received.clone());
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let mut s = s.unwrap();
                let (st, rc) = (st.clone(), rc.clone());
                std::thread::spawn(move || {
                    while read_request(&mut s).is_some() {
                        rc.fetch_add(1, Ordering::SeqCst);
                        while !st.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        let _ = s.write_all(&ok_response());
                    }
                });
            }
        });
        let st = stop.clone();
        let rc = received.clone();
        std::thread::spawn(move || {
            while rc.load(Ordering::SeqCst) < 16 {
                std::thread::sleep(Duration::from_millis(5));
            }
            st.store(true, Ordering::SeqCst);
        });
        let mut exec = UpstreamExecutor::new(client(base, Duration::from_secs(5)), stop.clone());
        let mut items = batch((0..20).map(|k| completion(&format!("p{k}"))).collect());
        exec.execute(&mut items, &mut NoTokens).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            received.load(Ordering::SeqCst),
            16,
            "requests started after stop"
        );
    }

    /// A base_url with a path (a gateway's route to one server): every request goes under
    /// it.
    #[test]
    fn a_base_url_with_a_path_keeps_it_in_every_request() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}/prefix", listener.local_addr().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let head = read_request(&mut s).unwrap();
            let _ = tx.send(head.lines().next().unwrap().to_string());
            let _ = s.write_all(&ok_response());
        });
        let mut exec = UpstreamExecutor::new(
            client(base, Duration::from_secs(5)),
            Arc::new(AtomicBool::new(false)),
        );
        let mut items = batch(vec![completion("x")]);
        exec.execute(&mut items, &mut NoTokens).unwrap();
        let line = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(line, "POST /prefix/v1/completions HTTP/1.1");
    }
}
