//! A response that another thread fills later: `POST /admin/reload` hands its work to the
//! live thread (`crate::live::thread`) and the io thread writes the answer once it is
//! there (it looks at connections waiting for one every tick, `server::io_thread`).
//!
//! What must never happen here: a response taken twice, or an io thread that waits (it
//! only ever tries to take).

use crate::http::response::Response;
use std::sync::Mutex;

/// One response, filled once by a worker thread, taken once by the io thread.
#[derive(Debug, Default)]
pub struct Deferred {
    response: Mutex<Option<Response>>,
}

impl Deferred {
    /// The answer is ready.
    pub fn fill(&self, response: Response) {
        *self.response.lock().unwrap_or_else(|e| e.into_inner()) = Some(response);
    }

    /// The answer, once it is filled (`None` until then, and after it was taken).
    pub fn take(&self) -> Option<Response> {
        self.response
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::response::Status;

    #[test]
    fn a_deferred_answer_is_taken_once_after_it_is_filled() {
        let d = Deferred::default();
        assert!(d.take().is_none());
        d.fill(Response::json(Status::Ok, b"{}".to_vec()));
        assert_eq!(d.take().map(|r| r.status.code()), Some(200));
        assert!(d.take().is_none());
    }
}
