//! API errors: who is at fault, and the one mapping to HTTP status and JSON body.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use thiserror::Error;
use zlink_store::StoreError;

/// Every response primary sends.
pub type Resp = Response<Full<Bytes>>;

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
    #[error("not found")]
    NotFound,
    #[error("this link has been disabled or has expired")]
    Gone,
    #[error("{1}")]
    Conflict(&'static str, String),
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    #[error("method not allowed")]
    MethodNotAllowed(&'static str),
    #[error("too many requests; retry after {0} s")]
    RateLimited(u64),
    // A dependency's fault: a retry later may help.
    #[error("a dependency is unavailable, retry later")]
    Unavailable(#[source] StoreError),
    #[error("request timed out")]
    Timeout,
    // Ours.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Invalid(..) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden | ApiError::ForbiddenBecause(..) => StatusCode::FORBIDDEN,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::Gone => StatusCode::GONE,
            ApiError::Conflict(..) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Invalid(code, _)
            | ApiError::Conflict(code, _)
            | ApiError::ForbiddenBecause(code, _) => code,
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden => "forbidden",
            ApiError::NotFound => "not_found",
            ApiError::Gone => "gone",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::RateLimited(_) => "rate_limited",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Timeout => "timeout",
            ApiError::Internal(_) => "internal",
        }
    }

    /// `{"error": {"code": ..., "message": ...}}`; internal details stay in the logs.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        match &self {
            ApiError::Internal(detail) => tracing::error!(detail = ?detail, "internal error"),
            // An open circuit answers thousands of requests a second: its opening was logged.
            ApiError::Unavailable(StoreError::CircuitOpen) => {}
            ApiError::Unavailable(e) => tracing::warn!(error = %e, "dependency unavailable"),
            _ => {}
        }
        let body = serde_json::json!({"error": {"code": self.code(), "message": self.to_string()}});
        let mut resp = json_response(self.status(), &body);
        if let ApiError::MethodNotAllowed(allow) = self {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
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

pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
