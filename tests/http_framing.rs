//! RFC 9112 framing over a real connection: a head two parsers could read two ways is
//! answered once with 400 and the connection closes, so nothing smuggled after it is ever
//! served. (Each rule is unit-tested in `http::parse`; this checks the connection end.)

use crate::common;

use common::{start, test_config, Client};

#[test]
fn ambiguous_framing_is_answered_once_and_nothing_after_it_is_served() {
    let abe = start(test_config());
    let smuggled = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    for head in [
        // CL.TE and TE.CL
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
        // disagreeing and signed lengths
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 0, 4\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: +0\r\n\r\n",
        // obs-fold hiding a header
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nX-A: a\r\n Content-Length: 4\r\n\r\n",
    ] {
        let mut c = Client::connect(abe.local_addr());
        c.send_raw(format!("{head}{smuggled}").as_bytes());
        let r = c.read_response().expect("one answer");
        assert_eq!(r.status, 400, "{head:?}: {}", r.text());
        assert_eq!(r.header("connection"), Some("close"), "{head:?}");
        assert!(c.is_closed(), "{head:?}: the smuggled request was served");
    }
    // A bare-LF head is one reading too: served, then the next request on the connection.
    let mut c = Client::connect(abe.local_addr());
    c.send_raw(format!("GET /health HTTP/1.1\nHost: t\n\n{smuggled}").as_bytes());
    assert_eq!(c.read_response().unwrap().status, 200);
    assert_eq!(c.read_response().unwrap().status, 200);
    abe.shutdown();
}
