//! Request bodies and headers the API reads: JSON bodies (media type, size cap, unknown fields
//! refused) and the `Idempotency-Key` header.

use crate::error::ApiError;
use http::{header, HeaderMap, Request};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;

/// Reads a JSON body: Content-Type checked, size capped while reading, unknown fields refused.
pub(crate) async fn read_json<T: DeserializeOwned>(
    req: Request<Incoming>,
    max: usize,
) -> Result<T, ApiError> {
    let is_json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(ApiError::UnsupportedMediaType);
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(ApiError::PayloadTooLarge(max));
    }
    let bytes = match Limited::new(req.into_body(), max).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::PayloadTooLarge(max))
        }
        Err(_) => {
            return Err(ApiError::BadRequest(
                "could not read the request body".into(),
            ))
        }
    };
    serde_json::from_slice(&bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::Invalid("invalid_request", e.to_string()),
        _ => ApiError::BadRequest(format!("request body is not valid JSON: {e}")),
    })
}

/// The `Idempotency-Key` header, if any: 1–255 visible ASCII characters.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match v.to_str() {
        Ok(k) if (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(Some(k.to_string()))
        }
        _ => Err(ApiError::Invalid(
            "invalid_idempotency_key",
            "Idempotency-Key must be 1-255 visible ASCII characters".into(),
        )),
    }
}
