//! The errors a redirect can end in, and the one renderer of every JSON error body either
//! tier sends: `{"error": {"code": ..., "message": ...}}` with `Cache-Control: no-store`.
//! Primary's API errors ([`render`] with their own codes) go through the same function, so the
//! shape cannot drift between tiers or between the API and the redirect path.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

/// Every response both tiers send.
pub type Resp = Response<Full<Bytes>>;

/// Why a redirect request did not redirect. Details (slugs, dependency errors) are logged by
/// whoever knows them; the response carries only the code and a fixed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Not a possible slug, never issued, or no such link.
    NotFound,
    /// Disabled or expired.
    Gone,
    /// Allowed methods, for the `Allow` header.
    MethodNotAllowed(&'static str),
    /// A dependency failed or its circuit is open: 503, so the nginx in front tries the next
    /// rung at once.
    Unavailable,
    /// The tier's own deadline passed: 503 for the same reason.
    Timeout,
    /// A stored value this tier cannot serve (logged where found).
    Internal,
}

impl Reject {
    pub fn status(self) -> StatusCode {
        match self {
            Reject::NotFound => StatusCode::NOT_FOUND,
            Reject::Gone => StatusCode::GONE,
            Reject::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Reject::Unavailable | Reject::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            Reject::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(self) -> &'static str {
        match self {
            Reject::NotFound => "not_found",
            Reject::Gone => "gone",
            Reject::MethodNotAllowed(_) => "method_not_allowed",
            Reject::Unavailable => "unavailable",
            Reject::Timeout => "timeout",
            Reject::Internal => "internal",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Reject::NotFound => "not found",
            Reject::Gone => "this link has been disabled or has expired",
            Reject::MethodNotAllowed(_) => "method not allowed",
            Reject::Unavailable => "a dependency is unavailable, retry later",
            Reject::Timeout => "request timed out",
            Reject::Internal => "internal error",
        }
    }

    pub fn into_response(self) -> Resp {
        let mut r = render(self.status(), self.code(), self.message());
        if let Reject::MethodNotAllowed(allow) = self {
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        r
    }
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// The one JSON error body ([`zlink_clients::ops::error`]).
pub fn render(status: StatusCode, code: &str, message: &str) -> Resp {
    zlink_clients::ops::error(status, code, message)
}

/// A JSON response that no cache keeps ([`zlink_clients::ops::json`]).
pub fn json<T: serde::Serialize + ?Sized>(status: StatusCode, body: &T) -> Resp {
    zlink_clients::ops::json(status, body)
}
