//! The link owners' page, `GET /dashboard/`: one HTML page, its script and its style sheet,
//! built into the binary (`primary/web/`). It signs in with an API key kept in the tab's
//! session storage and does everything through the public API (create, list and search,
//! disable, delete, QR code, click charts), so it has no server-side state and no power an API
//! client lacks. Served under a strict Content-Security-Policy: scripts and styles from this
//! origin only, no inline code, images from this origin or the page's own blobs (the QR code),
//! requests to this origin only, no framing.

use crate::error::{ApiError, Resp};
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use std::sync::LazyLock;

/// `/dashboard` without the slash (a reserved slug, never a link) leads to the page.
pub const PATH: &str = "/dashboard/";

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; \
                   connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

struct Asset {
    body: &'static str,
    content_type: &'static str,
    etag: HeaderValue,
}

fn asset(body: &'static str, content_type: &'static str) -> Asset {
    // FNV-1a of the content: the page changes only with the binary.
    let hash = body.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    Asset {
        body,
        content_type,
        etag: HeaderValue::from_str(&format!("\"{hash:016x}\"")).expect("hex is a header value"),
    }
}

static INDEX: LazyLock<Asset> = LazyLock::new(|| {
    asset(
        include_str!("../web/index.html"),
        "text/html; charset=utf-8",
    )
});
static SCRIPT: LazyLock<Asset> = LazyLock::new(|| {
    asset(
        include_str!("../web/app.js"),
        "text/javascript; charset=utf-8",
    )
});
static STYLE: LazyLock<Asset> =
    LazyLock::new(|| asset(include_str!("../web/app.css"), "text/css; charset=utf-8"));

/// `GET|HEAD /dashboard` (→ 308 to the page) and `/dashboard/<file>`.
#[utoipa::path(operation_id = "dashboard", get, path = "/dashboard/", tag = "owners",
    responses((status = 200, content_type = "text/html",
        description = "The link owners' page (with /dashboard/app.js and /dashboard/app.css); it uses this API with the owner's key")))]
pub fn serve(file: Option<&str>, method: &Method, headers: &HeaderMap) -> Result<Resp, ApiError> {
    if !matches!(*method, Method::GET | Method::HEAD) {
        return Err(ApiError::MethodNotAllowed("GET, HEAD"));
    }
    let asset: &Asset = match file {
        None => {
            let mut resp = Resp::new(Full::new(Bytes::new()));
            *resp.status_mut() = StatusCode::PERMANENT_REDIRECT;
            resp.headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static(PATH));
            return Ok(resp);
        }
        Some("" | "index.html") => &INDEX,
        Some("app.js") => &SCRIPT,
        Some("app.css") => &STYLE,
        Some(_) => return Err(ApiError::NotFound),
    };
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == asset.etag.as_bytes());
    let body = if fresh || *method == Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from_static(asset.body.as_bytes())
    };
    let mut resp = Resp::new(Full::new(body));
    if fresh {
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
    }
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(header::ETAG, asset.etag.clone());
    // Revalidated each time (an upgrade changes the page at once); a 304 costs no body.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert("x-robots-tag", HeaderValue::from_static("noindex"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(file: Option<&str>, headers: &HeaderMap) -> Resp {
        serve(file, &Method::GET, headers).unwrap()
    }

    #[test]
    fn the_page_its_script_and_style_under_a_strict_policy() {
        let none = HeaderMap::new();
        for (file, ty) in [
            (Some(""), "text/html"),
            (Some("app.js"), "text/javascript"),
            (Some("app.css"), "text/css"),
        ] {
            let r = get(file, &none);
            assert_eq!(r.status(), StatusCode::OK);
            let h = r.headers();
            assert!(h[header::CONTENT_TYPE].to_str().unwrap().starts_with(ty));
            let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(csp.starts_with("default-src 'none'; script-src 'self';"));
            assert!(!csp.contains("unsafe"));
            assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
            // Revalidation: the same ETag is answered 304 without a body.
            let mut cond = HeaderMap::new();
            cond.insert(header::IF_NONE_MATCH, h[header::ETAG].clone());
            assert_eq!(get(file, &cond).status(), StatusCode::NOT_MODIFIED);
        }
        assert_eq!(get(None, &none).status(), StatusCode::PERMANENT_REDIRECT);
        assert!(matches!(
            serve(Some("../Cargo.toml"), &Method::GET, &none),
            Err(ApiError::NotFound)
        ));
        assert!(matches!(
            serve(Some(""), &Method::POST, &none),
            Err(ApiError::MethodNotAllowed(_))
        ));
    }

    #[test]
    fn no_inline_code_and_nothing_parsed_as_html() {
        let page = INDEX.body;
        // Inline scripts, handlers and styles would be refused by the policy anyway.
        assert!(!page.contains("<script>") && !page.contains(" style="));
        assert!(!page.contains(" onclick=") && !page.contains(" onsubmit="));
        // The key field has no name: without the script, a submitted form carries no key.
        let key_input = page
            .split("<input id=\"key\"")
            .nth(1)
            .and_then(|s| s.split('>').next())
            .unwrap();
        assert!(!key_input.contains("name="));
        let script = SCRIPT.body;
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!script.contains(sink), "app.js uses {sink}");
        }
        // The key goes in a header, never in a URL or to another origin.
        assert!(script.contains("Authorization: 'Bearer '"));
        assert!(script.contains("credentials: 'omit'"));
    }
}
