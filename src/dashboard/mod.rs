//! `/dashboard`: the operator's page, served by abe itself. Its HTML, CSS and JavaScript are
//! compiled into the binary (`include_str!`), so it works offline and without a CDN; charts
//! are drawn by hand on `<canvas>` (no chart library). The page reads `/metrics/history`
//! once a second and listens to `/events`; its strategy switch calls
//! `POST /admin/strategy/{name}` (with the admin token when one is set).
//!
//! What lives here: the assets and the function that answers their paths. What must never
//! happen here: a request for anything but these fixed assets (no file system, no client
//! path reaching a lookup other than an exact match).

use crate::http::response::{Response, Status};

const INDEX_HTML: &str = include_str!("assets/index.html");
const DASHBOARD_JS: &str = include_str!("assets/dashboard.js");
const DASHBOARD_CSS: &str = include_str!("assets/dashboard.css");

/// `GET /`: a pointer to the dashboard (and the API), for a browser opening abe's address.
const ROOT_HTML: &str = "<!doctype html><html><head><meta charset=\"utf-8\">\
<meta http-equiv=\"refresh\" content=\"0; url=/dashboard\"><title>abe</title></head>\
<body><p>abe: see the <a href=\"/dashboard\">dashboard</a>; the OpenAI API is under /v1, \
metrics under <a href=\"/metrics\">/metrics</a>.</p></body></html>";

/// The asset at `path`, if it is one of the dashboard's (or `/`).
pub fn asset(path: &str) -> Option<Response> {
    let (content_type, body) = match path {
        "/" => ("text/html; charset=utf-8", ROOT_HTML),
        "/dashboard" | "/dashboard/" => ("text/html; charset=utf-8", INDEX_HTML),
        "/dashboard/dashboard.js" => ("text/javascript; charset=utf-8", DASHBOARD_JS),
        "/dashboard/dashboard.css" => ("text/css; charset=utf-8", DASHBOARD_CSS),
        _ => return None,
    };
    Some(
        Response::text(Status::Ok, content_type, body.as_bytes().to_vec())
            .with_header("Cache-Control: no-cache"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets() {
        for needle in ["http://", "https://", "//cdn", "@import"] {
            for (name, text) in [
                ("index.html", INDEX_HTML),
                ("dashboard.js", DASHBOARD_JS),
                ("dashboard.css", DASHBOARD_CSS),
            ] {
                assert!(!text.contains(needle), "{name} refers to {needle}");
            }
        }
        assert!(INDEX_HTML.contains("/dashboard/dashboard.js"));
        assert!(INDEX_HTML.contains("/dashboard/dashboard.css"));
        assert!(asset("/dashboard").is_some());
        assert!(asset("/dashboard/../Cargo.toml").is_none());
        assert!(asset("/").is_some());
    }
}
