//! Recovery when a spool opens: every segment checked record by record, torn or corrupt
//! tails cut off (the zeros of a preallocated segment's unused rest are not counted as cut),
//! segments the reader fully committed deleted, and the reader's position moved to the first
//! segment that is left.

use super::format::{list_segments, read_position, scan_segment, segment_path, sync_dir};
use super::{Position, Recovery, MAGIC_LEN};
use std::fs::{self, OpenOptions};
use std::io;
use std::path::Path;

/// Checks the spool in `dir` and repairs it: returns the reader's position, what was found
/// (pending records, what was cut), the bytes the kept segments hold, and the sequence number
/// of the next segment.
pub(super) fn recover(dir: &Path) -> io::Result<(Position, Recovery, u64, u64)> {
    let seqs = list_segments(dir)?;
    let mut pos = read_position(dir).unwrap_or(Position {
        segment: 0,
        offset: MAGIC_LEN,
    });
    let mut report = Recovery::default();
    let mut disk = 0;
    let mut kept = Vec::new();
    for &seq in &seqs {
        let path = segment_path(dir, seq);
        if seq < pos.segment {
            fs::remove_file(&path)?; // fully committed before the last stop
            continue;
        }
        let bytes = fs::read(&path)?;
        let from = if seq == pos.segment { pos.offset } else { 0 };
        let (valid, pending) = scan_segment(&bytes, from);
        if valid == 0 {
            // Not even the magic: nothing in it can be trusted.
            report.cut_bytes += bytes.len() as u64;
            report.cut_segments += 1;
            fs::remove_file(&path)?;
            continue;
        }
        if valid < bytes.len() as u64 {
            let f = OpenOptions::new().write(true).open(&path)?;
            f.set_len(valid)?;
            f.sync_all()?;
            // What was written past the last good record, up to its last non-zero byte;
            // the zeros after it are the unused rest of a preallocated segment.
            let written = bytes
                .iter()
                .rposition(|&b| b != 0)
                .map_or(0, |i| i as u64 + 1);
            let cut = written.saturating_sub(valid);
            if cut == 0 {
                tracing::debug!(
                    segment = seq,
                    unused = bytes.len() as u64 - valid,
                    "spool: unused preallocated tail cut off"
                );
            } else {
                report.cut_bytes += cut;
                report.cut_segments += 1;
                tracing::warn!(
                    segment = seq,
                    kept = valid,
                    cut,
                    "spool: torn or corrupt tail cut off"
                );
            }
        }
        if seq == pos.segment && pos.offset > valid {
            pos.offset = valid;
        }
        report.pending += pending;
        disk += valid;
        kept.push(seq);
    }
    if report.cut_segments > 0 {
        sync_dir(dir)?;
    }
    let next = seqs.last().map_or(1, |s| s + 1);
    match kept.first() {
        Some(&first) if first > pos.segment => {
            pos = Position {
                segment: first,
                offset: MAGIC_LEN,
            }
        }
        None => {
            pos = Position {
                segment: next,
                offset: MAGIC_LEN,
            }
        }
        _ => {}
    }
    Ok((pos, report, disk, next))
}
