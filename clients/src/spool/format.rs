//! The spool's bytes on disk: segment names, the record encoding (length, CRC32, payload),
//! scanning a segment for its last good record, and the reader's position file.

use super::{Position, HEADER, MAGIC, MAX_RECORD, POSITION};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.seg"))
}

pub(super) fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut seqs = Vec::new();
    for e in fs::read_dir(dir)? {
        let name = e?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name.strip_suffix(".seg") {
            // 20 digits can exceed u64 (a file no spool of ours wrote): ignored, never a panic.
            match n.parse::<u64>() {
                Ok(seq) if n.len() == 20 && n.bytes().all(|b| b.is_ascii_digit()) => seqs.push(seq),
                _ => tracing::warn!(file = ?name, "spool: ignoring a file that is not a segment"),
            }
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

pub(super) fn crc(len: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Encodes one record.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    encode_into(&mut out, payload);
    out
}

pub(super) fn encode_into(out: &mut Vec<u8>, payload: &[u8]) {
    let at = out.len();
    out.resize(at + HEADER + payload.len(), 0);
    encode_to(&mut out[at..], payload);
}

/// Encodes one record into `dst`, exactly its size (`HEADER + payload.len()`).
pub(super) fn encode_to(dst: &mut [u8], payload: &[u8]) {
    let len = payload.len() as u32;
    let (header, body) = dst.split_at_mut(HEADER);
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4..].copy_from_slice(&crc(len, payload).to_le_bytes());
    body.copy_from_slice(payload);
}

/// Decodes the record at the start of `buf`: `Ok(Some((payload, size)))`, `Ok(None)` when
/// `buf` ends inside it, `Err(())` when it is not a valid record.
#[allow(clippy::result_unit_err)]
pub fn decode(buf: &[u8]) -> Result<Option<(&[u8], usize)>, ()> {
    if buf.len() < HEADER {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes"));
    if len == 0 || len as usize > MAX_RECORD {
        return Err(());
    }
    let size = HEADER + len as usize;
    if buf.len() < size {
        return Ok(None);
    }
    let want = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    let payload = &buf[HEADER..size];
    if crc(len, payload) != want {
        return Err(());
    }
    Ok(Some((payload, size)))
}

/// Checks a segment; returns (length of its valid prefix, records at or after `from`).
pub(super) fn scan_segment(bytes: &[u8], from: u64) -> (u64, u64) {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return (0, 0);
    }
    let mut off = MAGIC.len();
    let mut after = 0;
    while let Ok(Some((_, size))) = decode(&bytes[off..]) {
        if off as u64 >= from {
            after += 1;
        }
        off += size;
    }
    (off as u64, after)
}

pub(super) fn read_position(dir: &Path) -> Option<Position> {
    let b = fs::read(dir.join(POSITION)).ok()?;
    if b.len() != 20 {
        return None;
    }
    let want = u32::from_le_bytes(b[16..20].try_into().ok()?);
    if crc32fast::hash(&b[..16]) != want {
        return None;
    }
    Some(Position {
        segment: u64::from_le_bytes(b[0..8].try_into().ok()?),
        offset: u64::from_le_bytes(b[8..16].try_into().ok()?),
    })
}

pub(super) fn write_position(dir: &Path, p: Position) -> io::Result<()> {
    let mut b = Vec::with_capacity(20);
    b.extend_from_slice(&p.segment.to_le_bytes());
    b.extend_from_slice(&p.offset.to_le_bytes());
    b.extend_from_slice(&crc32fast::hash(&b).to_le_bytes());
    let tmp = dir.join("position.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(&b)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(POSITION))?;
    sync_dir(dir)
}

/// Creates segment `seq` with its magic. Nothing is synced here (segments start on the append
/// path): the flusher syncs a segment with its first records, and the directory after it
/// (`Active::dir_unsynced`).
pub(super) fn new_segment(dir: &Path, seq: u64) -> io::Result<File> {
    // Readable too: a shared writable mapping needs a descriptor open for reading.
    let mut f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .append(true)
        .open(segment_path(dir, seq))?;
    f.write_all(MAGIC)?;
    Ok(f)
}
