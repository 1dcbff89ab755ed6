//! The staging ring: where [`super::Spool::append`] puts a record. A file `ring` in the spool
//! directory, preallocated, mapped shared and touched once when the spool opens, then reused
//! lap after lap: an append is a copy into pages that are already mapped and writable, with
//! no system call and, after the first lap, no page fault. The flusher moves what the ring
//! holds into the active segment with one `write(2)` per batch and fsyncs that.
//!
//! Why not map the segment itself, as the spool did until 2026-12-07: every first write to a
//! segment page faulted (page allocation, ext4's `page_mkwrite`, the inode's time), each fsync
//! write-protected the mapped pages again, and a fresh 8 MiB segment every ~25,000 clicks meant
//! a fault per ~13 clicks on the serving thread. A ring's pages are faulted once and are never
//! fsynced: the kernel writes them back in the background at most every dirty-expiry interval,
//! and only then does a page fault again.
//!
//! A process crash loses nothing: the ring's pages are the file's, in the page cache, and the
//! next [`super::Spool::open`] moves what was not yet in a segment (`[tail, head)`, the header's
//! counters) into its first segment before anything else, records checked one by one. Records
//! moved to a segment just before the crash, whose tail did not reach the header, are moved
//! again: delivered twice, never lost (the spool's contract is at least once; records carry
//! their ids). After a reboot (a different boot id) the ring is not trusted: what it held past
//! the last fsync of its segment is what a power loss loses anyway (the fsync window).
//!
//! Layout: a 4 KiB header (`ZLRING01`, capacity u64 LE, the boot id's 16 bytes, `head` at 64
//! and `tail` at 128 as u64 LE: bytes ever appended and ever moved, so `head - tail` is what the
//! ring holds), then `capacity` bytes of records in the segments' encoding, wrapping at the end.

use super::format::encode_to;
use super::{HEADER, MAX_RECORD};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub(super) const RING: &str = "ring";
const MAGIC: &[u8; 8] = b"ZLRING01";
const HEAD_PAGE: u64 = 4096;
const OFF_CAP: usize = 8;
const OFF_BOOT: usize = 16;
const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
const PAGE: usize = 4096;

/// This boot's id (`/proc/sys/kernel/random/boot_id`), 16 bytes; `None` where it cannot be read.
pub(super) fn boot_id() -> Option<[u8; 16]> {
    let s = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: Vec<u8> = s.trim().bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        id[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(id)
}

pub(super) struct Ring {
    map: memmap2::MmapRaw,
    cap: u64,
    _file: File,
}

/// What an earlier process left in the ring.
#[derive(Debug, Default)]
pub(super) struct Leftover {
    /// The records not yet moved to a segment, in order, encoded as in a segment.
    pub bytes: Vec<u8>,
    /// Bytes not trusted: the ring of another boot, or a header that does not add up.
    pub discarded: u64,
}

impl Ring {
    /// Creates the ring file in `dir` afresh (`cap` bytes of records), preallocated (a copy
    /// into a mapped page can never meet a full disk, which would be SIGBUS instead of an
    /// error), mapped, every page touched once.
    pub(super) fn create(dir: &Path, cap: u64, boot: [u8; 16]) -> io::Result<Ring> {
        use std::os::fd::AsRawFd;
        if cap < (HEADER + MAX_RECORD) as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring smaller than one record",
            ));
        }
        let path = dir.join(RING);
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        let size = HEAD_PAGE + cap;
        let len = libc::off_t::try_from(size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ring size"))?;
        // SAFETY: a plain call on an open descriptor we own.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let map = memmap2::MmapOptions::new()
            .len(usize::try_from(size).map_err(|_| io::Error::other("ring size"))?)
            .map_raw(&file)?;
        let ring = Ring {
            map,
            cap,
            _file: file,
        };
        // SAFETY: nothing else uses the new mapping yet; every write is inside it.
        unsafe {
            let p = ring.map.as_mut_ptr();
            std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), p, MAGIC.len());
            std::ptr::copy_nonoverlapping(cap.to_le_bytes().as_ptr(), p.add(OFF_CAP), 8);
            std::ptr::copy_nonoverlapping(boot.as_ptr(), p.add(OFF_BOOT), 16);
            // The first lap's faults now, at open, instead of on the serving path.
            for at in (0..size as usize).step_by(PAGE) {
                std::ptr::write_volatile(p.add(at), std::ptr::read_volatile(p.add(at)));
            }
        }
        ring.set_head(0);
        ring.set_tail(0);
        Ok(ring)
    }

    /// Reads what a ring file in `dir` holds that never reached a segment (`None`: no ring
    /// file). Trusted only from this boot (`boot`) and with a header that adds up; the
    /// records themselves are checked by the caller as it moves them.
    pub(super) fn leftover(dir: &Path, boot: Option<[u8; 16]>) -> io::Result<Option<Leftover>> {
        let bytes = match fs::read(dir.join(RING)) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let u64_at = |at: usize| {
            bytes
                .get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        let (Some(cap), Some(head), Some(tail)) =
            (u64_at(OFF_CAP), u64_at(OFF_HEAD), u64_at(OFF_TAIL))
        else {
            return Ok(Some(Leftover::default()));
        };
        let held = head.wrapping_sub(tail);
        let sane = bytes.starts_with(MAGIC)
            && cap > 0
            && bytes.len() as u64 >= HEAD_PAGE.saturating_add(cap)
            && head >= tail
            && held <= cap;
        if !sane {
            return Ok(Some(Leftover::default()));
        }
        if boot.is_none() || bytes.get(OFF_BOOT..OFF_BOOT + 16) != boot.as_ref().map(|b| &b[..]) {
            return Ok(Some(Leftover {
                bytes: Vec::new(),
                discarded: held,
            }));
        }
        let data = &bytes[HEAD_PAGE as usize..(HEAD_PAGE + cap) as usize];
        let (from, to) = ((tail % cap) as usize, (head % cap) as usize);
        let mut out = Vec::with_capacity(held as usize);
        if held > 0 && from < to {
            out.extend_from_slice(&data[from..to]);
        } else if held > 0 {
            out.extend_from_slice(&data[from..]);
            out.extend_from_slice(&data[..to]);
        }
        Ok(Some(Leftover {
            bytes: out,
            discarded: 0,
        }))
    }

    pub(super) fn cap(&self) -> u64 {
        self.cap
    }

    fn counter(&self, at: usize) -> &AtomicU64 {
        // SAFETY: the header is inside the mapping, which lives as long as `self`; offsets 64
        // and 128 of a page-aligned mapping are 8-byte aligned; the counters are only ever
        // accessed atomically while mapped.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(at).cast::<u64>()) }
    }

    /// Records the head in the file (after the record's bytes: a crash in between loses a
    /// record whose append never returned).
    pub(super) fn set_head(&self, head: u64) {
        self.counter(OFF_HEAD).store(head, Ordering::Release);
    }

    /// Records the tail in the file (after the records before it reached a segment).
    pub(super) fn set_tail(&self, tail: u64) {
        self.counter(OFF_TAIL).store(tail, Ordering::Release);
    }

    /// Encodes `payload` as a record at ring position `at` (wrapping at the end).
    ///
    /// # Safety
    /// `[at, at + HEADER + payload.len())` must be free: written by nobody else and read by
    /// nobody until the head passes it (the spool appends under its lock, with the head there
    /// and the record's size within what the tail leaves free).
    pub(super) unsafe fn put(&self, at: u64, payload: &[u8]) {
        let size = HEADER + payload.len();
        let off = (at % self.cap) as usize;
        let room = self.cap as usize - off;
        let base = self.map.as_mut_ptr().add(HEAD_PAGE as usize);
        if size <= room {
            encode_to(std::slice::from_raw_parts_mut(base.add(off), size), payload);
        } else {
            // Across the end: encoded aside, then copied in two parts (rare: one record a lap).
            let mut rec = vec![0u8; size];
            encode_to(&mut rec, payload);
            std::ptr::copy_nonoverlapping(rec.as_ptr(), base.add(off), room);
            std::ptr::copy_nonoverlapping(rec.as_ptr().add(room), base, size - room);
        }
    }

    /// The bytes of `[from, to)`, in order: one or two slices (the second empty unless the
    /// range wraps).
    ///
    /// # Safety
    /// Nobody may write `[from, to)` while the slices live (the spool moves the tail past
    /// them only after they are written out, and appends only ahead of the head).
    pub(super) unsafe fn slices(&self, from: u64, to: u64) -> (&[u8], &[u8]) {
        let n = (to - from) as usize;
        let off = (from % self.cap) as usize;
        let room = self.cap as usize - off;
        let base = self.map.as_ptr().add(HEAD_PAGE as usize);
        if n <= room {
            (std::slice::from_raw_parts(base.add(off), n), &[])
        } else {
            (
                std::slice::from_raw_parts(base.add(off), room),
                std::slice::from_raw_parts(base, n - room),
            )
        }
    }
}
