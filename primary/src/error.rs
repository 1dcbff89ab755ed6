//! API errors: who is at fault, and the one mapping to HTTP status and error code. The body
//! is rendered by the redirect kit ([`zlink_redirect::error::render`]), like every error either
//! tier sends; the errors a redirect shares with lastresort carry the kit's messages
//! ([`Reject`]).

use http::{header, HeaderValue, StatusCode};
use thiserror::Error;
use zlink_redirect::Reject;
use zlink_store::StoreError;

/// A JSON response that no cache keeps.
pub use zlink_redirect::error::json as json_response;
/// Every response primary sends.
pub use zlink_redirect::Resp;

#[derive(Debug, Error)]
pub enum ApiError {
    // The client's fault: retrying the same request cannot help.
    #[error("{0}")]
    BadRequest(String),
    #[error("{1}")]
    Invalid(&'static str, String),
    #[error("missing or unknown API key")]
    Unauthorized,
    #[error("this API key may not access this link")]
    Forbidden,
    #[error("{1}")]
    ForbiddenBecause(&'static str, String),
    #[error("{}", Reject::NotFound)]
    NotFound,
    #[error("{}", Reject::Gone)]
    Gone,
    #[error("{1}")]
    Conflict(&'static str, String),
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    #[error("{}", Reject::MethodNotAllowed(""))]
    MethodNotAllowed(&'static str),
    #[error("too many requests; retry after {0} s")]
    RateLimited(u64),
    // A dependency's fault: a retry later may help.
    #[error("{}", Reject::Unavailable)]
    Unavailable(#[source] StoreError),
    #[error("{}", Reject::Timeout)]
    Timeout,
    // Ours.
    #[error("{}", Reject::Internal)]
    Internal(String),
}

impl ApiError {
    /// The errors a redirect shares with lastresort: the kit's status, code and message.
    fn shared(&self) -> Option<Reject> {
        Some(match self {
            ApiError::NotFound => Reject::NotFound,
            ApiError::Gone => Reject::Gone,
            ApiError::MethodNotAllowed(allow) => Reject::MethodNotAllowed(allow),
            ApiError::Unavailable(_) => Reject::Unavailable,
            ApiError::Timeout => Reject::Timeout,
            ApiError::Internal(_) => Reject::Internal,
            _ => return None,
        })
    }

    pub fn status(&self) -> StatusCode {
        if let Some(r) = self.shared() {
            return r.status();
        }
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Invalid(..) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden | ApiError::ForbiddenBecause(..) => StatusCode::FORBIDDEN,
            ApiError::Conflict(..) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        if let Some(r) = self.shared() {
            return r.code();
        }
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Invalid(code, _)
            | ApiError::Conflict(code, _)
            | ApiError::ForbiddenBecause(code, _) => code,
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden => "forbidden",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::RateLimited(_) => "rate_limited",
            _ => "internal",
        }
    }

    /// Internal details and dependency failures go to the log, never the response.
    pub(crate) fn log(&self) {
        match self {
            ApiError::Internal(detail) => tracing::error!(detail = ?detail, "internal error"),
            // An open circuit answers thousands of requests a second: its opening was logged.
            ApiError::Unavailable(StoreError::CircuitOpen) => {}
            ApiError::Unavailable(e) => tracing::warn!(error = %e, "dependency unavailable"),
            _ => {}
        }
    }

    /// The redirect path's view of this error (logged here). API-only errors cannot happen
    /// there; they would be internal errors.
    pub fn reject(self) -> Reject {
        self.log();
        self.shared().unwrap_or(Reject::Internal)
    }

    /// `{"error": {"code": ..., "message": ...}}` with the status and its headers.
    pub fn into_response(self) -> Resp {
        self.log();
        if let Some(r) = self.shared() {
            return r.into_response();
        }
        let mut resp = zlink_redirect::error::render(self.status(), self.code(), &self.to_string());
        if let ApiError::RateLimited(secs) = self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if matches!(self, ApiError::Unauthorized) {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Corrupt(detail) => ApiError::Internal(detail),
            other => ApiError::Unavailable(other),
        }
    }
}
