//! `GET /api/v1/links/{slug}/qr?format=svg|png&size=`: a QR code of the link's short URL
//! (owner or admin key), error correction level M, a 4-module quiet zone. SVG by default; PNG
//! 8-bit greyscale, `size` pixels wide at least (each module a whole number of pixels). A
//! deleted link has none (410).

use crate::api::load_managed;
use crate::app::AppState;
use crate::error::{ApiError, Resp};
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use qrcode::{EcLevel, QrCode};
use zlink_wire::LinkStatus;

pub const DEFAULT_SIZE: u32 = 256;
pub const MAX_SIZE: u32 = 2048;
const QUIET_MODULES: u32 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

/// Parses `format` and `size`; anything else, repeated or out of range is refused.
pub fn parse_query(query: Option<&str>) -> Result<(Format, u32), ApiError> {
    let (mut format, mut size) = (None, None);
    let invalid = |code: &'static str, m: &str| ApiError::Invalid(code, m.to_string());
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "format" if format.is_none() => {
                format = Some(match v.as_ref() {
                    "svg" => Format::Svg,
                    "png" => Format::Png,
                    _ => return Err(invalid("invalid_format", "format must be svg or png")),
                });
            }
            "size" if size.is_none() => {
                size = Some(
                    v.parse::<u32>()
                        .ok()
                        .filter(|s| (64..=MAX_SIZE).contains(s))
                        .ok_or_else(|| invalid("invalid_size", "size must be 64 to 2048"))?,
                );
            }
            // The link's domain: read by the route (`crate::hosts::key_of`).
            "domain" => {}
            _ => {
                return Err(invalid(
                    "invalid_query",
                    "known query parameters, once each: format, size, domain",
                ))
            }
        }
    }
    Ok((format.unwrap_or(Format::Svg), size.unwrap_or(DEFAULT_SIZE)))
}

/// The QR code of `text` as SVG, `size` pixels wide at least.
pub fn svg(text: &str, size: u32) -> Result<String, ApiError> {
    let code = encode(text)?;
    Ok(code
        .render::<qrcode::render::svg::Color<'_>>()
        .quiet_zone(true)
        .min_dimensions(size, size)
        .build())
}

/// The QR code of `text` as an 8-bit greyscale PNG, `size` pixels wide at least.
pub fn png(text: &str, size: u32) -> Result<Vec<u8>, ApiError> {
    let code = encode(text)?;
    let modules = u32::try_from(code.width()).map_err(|e| ApiError::Internal(e.to_string()))?;
    let side = modules + 2 * QUIET_MODULES;
    let scale = size.div_ceil(side).max(1);
    let px = side * scale;
    let colors = code.to_colors();
    let mut image = vec![255u8; (px * px) as usize];
    for (i, c) in colors.iter().enumerate() {
        if *c != qrcode::Color::Dark {
            continue;
        }
        let (mx, my) = (i as u32 % modules, i as u32 / modules);
        for y in 0..scale {
            let row = ((my + QUIET_MODULES) * scale + y) * px;
            let x0 = row + (mx + QUIET_MODULES) * scale;
            image[x0 as usize..(x0 + scale) as usize].fill(0);
        }
    }
    let mut out = Vec::new();
    let mut enc = ::png::Encoder::new(&mut out, px, px);
    enc.set_color(::png::ColorType::Grayscale);
    enc.set_depth(::png::BitDepth::Eight);
    let internal = |e: ::png::EncodingError| ApiError::Internal(format!("png: {e}"));
    let mut w = enc.write_header().map_err(internal)?;
    w.write_image_data(&image).map_err(internal)?;
    w.finish().map_err(internal)?;
    Ok(out)
}

fn encode(text: &str) -> Result<QrCode, ApiError> {
    QrCode::with_error_correction_level(text.as_bytes(), EcLevel::M)
        .map_err(|e| ApiError::Internal(format!("qr code of {} bytes: {e}", text.len())))
}

/// `GET /api/v1/links/{slug}/qr`
#[utoipa::path(operation_id = "link_qr", get, path = "/api/v1/links/{slug}/qr", tag = "links",
    params(("slug" = String, Path), ("domain" = Option<String>, Query),
        ("format" = Option<String>, Query, description = "svg (default) or png"),
        ("size" = Option<u32>, Query, description = "64 to 2048 pixels")),
    responses((status = 200, content_type = "image/svg+xml", description = "SVG or PNG image"),
        (status = 410, body = crate::views::Error)),
    security(("bearer" = [])))]
pub async fn get<B>(state: &AppState, req: &Request<B>, slug: &str) -> Result<Resp, ApiError> {
    let principal = state.principal(req).await?;
    let link = load_managed(state, &principal, slug, false).await?;
    let (format, size) = parse_query(req.uri().query())?;
    if link.status == LinkStatus::Deleted {
        return Err(ApiError::Gone);
    }
    let short_url = state.short_url(&link.key);
    // Rendered on a blocking thread: a large PNG can take milliseconds of CPU, which on a
    // runtime with one worker (`--worker-threads 1`) every redirect would wait behind.
    let (body, content_type) = tokio::task::spawn_blocking(move || {
        Ok::<_, ApiError>(match format {
            Format::Svg => (Bytes::from(svg(&short_url, size)?), "image/svg+xml"),
            Format::Png => (Bytes::from(png(&short_url, size)?), "image/png"),
        })
    })
    .await
    .map_err(|e| ApiError::Internal(format!("qr code: {e}")))??;
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The code depends only on the short URL, which never changes.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=86400"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // An SVG opened on its own runs nothing.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_parsed_strictly() {
        assert_eq!(parse_query(None).unwrap(), (Format::Svg, DEFAULT_SIZE));
        assert_eq!(
            parse_query(Some("format=png&size=512")).unwrap(),
            (Format::Png, 512)
        );
        for bad in [
            "format=gif",
            "size=10",
            "size=4096",
            "size=x",
            "format=svg&format=png",
            "colour=red",
        ] {
            assert!(
                matches!(parse_query(Some(bad)), Err(ApiError::Invalid(..))),
                "{bad}"
            );
        }
    }

    #[test]
    fn png_is_at_least_the_size_asked_in_whole_modules() {
        let img = png("https://zl.example/abcdefg", 256).unwrap();
        let decoder = ::png::Decoder::new(std::io::Cursor::new(img));
        let reader = decoder.read_info().unwrap();
        let info = reader.info();
        assert!(info.width >= 256 && info.width == info.height);
        let side = encode("https://zl.example/abcdefg").unwrap().width() as u32 + 8;
        assert_eq!(info.width % side, 0, "{} px for {side} modules", info.width);
        assert!(info.width < 256 + side, "the smallest whole scale");
    }

    #[test]
    fn svg_is_an_svg_document() {
        let s = svg("https://zl.example/abcdefg", 256).unwrap();
        assert!(s.starts_with("<?xml"));
        assert!(s.contains("<svg") && s.ends_with("</svg>"));
        assert!(!s.contains("<script"));
    }
}
