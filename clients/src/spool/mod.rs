//! A local durable spool: append-only segment files of checksummed records, read back in order
//! by one reader that persists how far it got. Used for clicks by every tier that redirects, so
//! that no redirect ever waits on Kafka and no click is lost while Kafka is away.
//!
//! On disk, in one directory (locked by the process that opened it):
//! - `<20-digit seq>.seg`: the 8-byte magic `ZLSPOOL1`, then records
//!   `[len: u32 LE][crc32(len bytes ++ payload): u32 LE][payload]`, 1 ≤ len ≤ [`MAX_RECORD`].
//! - `position`: where the reader's last committed batch ended, `[segment u64][offset u64][crc32]`,
//!   replaced atomically (write temp, fsync, rename, fsync dir).
//!
//! Guarantees:
//! - `append` returns once the record is in the spool's staging ring ([`ring`]: a file in the
//!   spool directory, mapped shared, preallocated and touched once at open, reused lap after
//!   lap), never after an fsync (group commit), so a process crash (SIGKILL, panic, OOM kill)
//!   loses nothing that was appended: the ring's pages are the file's, not the process's, and
//!   the next [`Spool::open`] moves what the ring still holds into a segment first. An append is
//!   a copy into pages already mapped and writable, under a mutex, with no system call and no
//!   page fault (a `write(2)` per click, with the mutex held across it, was ~11% of a
//!   redirect's CPU; a copy into a mapped segment took a page fault on every fresh 4 KiB, ~13
//!   clicks, and again after each fsync). A flusher thread moves the ring's records into the
//!   active segment with one `write(2)` per batch and fsyncs them (`fsync_records` records or
//!   `fsync_interval` after the first unsynced one, whichever comes first; a rolled-over
//!   segment at once): a power loss loses at most that window. The reader moves them too
//!   when it finds the segments read to their end, so it never waits for the flusher. Where
//!   the ring cannot be made (a filesystem that cannot preallocate or map, `ring_bytes` 0),
//!   appends are one `write(2)` each into the segment.
//! - The reader delivers every record at least once, in append order: it moves its durable
//!   position only past records its caller confirmed ([`Reader::commit`]); a crash before the
//!   commit re-delivers them. Records carry their own ids, so consumers deduplicate.
//! - A torn or corrupt tail (a crash in the middle of a write, a zero-filled block after power
//!   loss, a flipped bit) fails the length or checksum test at [`Spool::open`] and is cut off:
//!   the file is truncated at the last good record and the cut bytes are reported. Nothing
//!   after the first bad record of a segment is trusted. Zeros at the end of a segment are the
//!   unused rest of a preallocated segment whose process did not close it (a crash): cut as
//!   well, but not counted as cut bytes, since nothing was ever written there (a power loss
//!   that zeroed unsynced records looks the same, and loses no more than its fsync window).
//! - Disk cap (`max_bytes`, all segment files together): when an append would pass it, the new
//!   record is refused with [`AppendError::Full`] and counted; records already spooled are
//!   never dropped to make room (they are older clicks that are owed to the counter). The cap
//!   frees itself as the reader commits and whole segments are deleted.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod format;
mod reader;
mod recover;
mod ring;
#[cfg(test)]
mod tests;
pub use format::{decode, encode};
use format::{encode_into, new_segment, segment_path, sync_dir, write_position};
pub use reader::{Batch, Reader};

pub const MAX_RECORD: usize = 64 * 1024;
/// The staging ring's default size: ~12,000 clicks, 0.3 s of a tier's peak.
pub const DEFAULT_RING_BYTES: u64 = 4 * 1024 * 1024;
const MAGIC: &[u8; 8] = b"ZLSPOOL1";
const MAGIC_LEN: u64 = MAGIC.len() as u64;
const HEADER: usize = 8;
const POSITION: &str = "position";
const LOCK: &str = "lock";
/// Bytes read from a segment at once.
const CHUNK: usize = 256 * 1024;

#[derive(Debug, Clone)]
pub struct SpoolConfig {
    pub dir: PathBuf,
    /// A segment is closed and a new one started once it would pass this size.
    pub segment_bytes: u64,
    /// Cap on all segment files together.
    pub max_bytes: u64,
    /// fsync after this many unsynced records...
    pub fsync_records: usize,
    /// ...or this long after the first unsynced record.
    pub fsync_interval: Duration,
    /// Bytes of the staging ring appends copy into (at most half a segment is used; 0: no
    /// ring, every append is a `write(2)`).
    pub ring_bytes: u64,
}

impl SpoolConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SpoolConfig {
            dir: dir.into(),
            segment_bytes: 8 * 1024 * 1024,
            max_bytes: 1024 * 1024 * 1024,
            fsync_records: 1024,
            fsync_interval: Duration::from_millis(20),
            ring_bytes: DEFAULT_RING_BYTES,
        }
    }

    /// The ring's capacity as used: `ring_bytes`, at most half a segment (so whatever the
    /// flusher moves at once fits in one), 0 for none.
    fn ring_cap(&self) -> u64 {
        self.ring_bytes.min(self.segment_bytes / 2)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.segment_bytes < 2 * (MAX_RECORD as u64 + HEADER as u64) {
            return Err(format!(
                "spool segment size must be at least {} bytes",
                2 * (MAX_RECORD + HEADER)
            ));
        }
        if self.max_bytes < 2 * self.segment_bytes {
            return Err("spool cap must be at least two segments".into());
        }
        if self.fsync_records == 0 || self.fsync_interval.is_zero() {
            return Err("spool fsync batch and interval must be positive".into());
        }
        if self.ring_bytes != 0 && self.ring_bytes < (MAX_RECORD + HEADER) as u64 {
            return Err(format!(
                "spool ring must be 0 (none) or at least {} bytes",
                MAX_RECORD + HEADER
            ));
        }
        Ok(())
    }
}

/// A place in the spool: a segment and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("spool is full (cap reached); record refused")]
    Full,
    #[error("record is empty or larger than {MAX_RECORD} bytes")]
    Size,
    #[error("spool is closed")]
    Closed,
    #[error("spool I/O: {0}")]
    Io(#[from] io::Error),
}

/// Space on a filesystem (`statvfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    /// Bytes an unprivileged writer may still use (`f_bavail`).
    pub free: u64,
    /// The filesystem's size (`f_blocks`).
    pub size: u64,
}

/// Free and total bytes of the filesystem holding `dir`.
pub fn filesystem_space(dir: &Path) -> io::Result<FsSpace> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a pointer to a statvfs the call fills in.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize;
    Ok(FsSpace {
        free: st.f_bavail.saturating_mul(frsize),
        size: st.f_blocks.saturating_mul(frsize),
    })
}

/// What [`Spool::open`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Records spooled but not yet committed by the reader.
    pub pending: u64,
    /// Bytes cut off as torn or corrupt, and the segments they were cut from.
    pub cut_bytes: u64,
    pub cut_segments: usize,
    /// Records the staging ring held that had not reached a segment (moved into one now).
    pub ring_moved: u64,
    /// Bytes of a ring not trusted (another boot's, or a header that did not add up).
    pub ring_discarded: u64,
}

/// Counters of a live spool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub pending: u64,
    pub disk_bytes: u64,
    pub refused_full: u64,
    /// Failed writes and fsyncs.
    pub io_errors: u64,
    /// Records found unreadable after start (changed on disk underneath) and skipped.
    pub corrupt_skipped: u64,
}

struct Active {
    seq: u64,
    file: Arc<File>,
    /// Bytes in the active segment (what the reader may read of it).
    len: u64,
    /// Bytes ever put into the ring and ever moved out of it (`Shared::ring`): the ring holds
    /// `ring_head - ring_tail`.
    ring_head: u64,
    ring_tail: u64,
    unsynced: usize,
    first_unsynced: Option<Instant>,
    /// Segments rolled over but not yet fsynced (the flusher does that, off the append path).
    retired: Vec<Arc<File>>,
    /// A segment was created since the directory was last synced: its name is not durable
    /// until it is (the flusher syncs the directory after the segment's records).
    dir_unsynced: bool,
    closed: bool,
}

struct Shared {
    cfg: SpoolConfig,
    active: Mutex<Active>,
    /// The staging ring; `None`: appends are `write(2)`s into the active segment.
    ring: Option<ring::Ring>,
    /// Held while records move from the ring to a segment (one mover at a time; the
    /// appenders go on meanwhile).
    drain: Mutex<()>,
    flush: Condvar,
    /// Wakes the reader when something was appended.
    data: tokio::sync::Notify,
    pending: AtomicU64,
    disk_bytes: AtomicU64,
    refused_full: AtomicU64,
    io_errors: AtomicU64,
    corrupt_skipped: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Active> {
        // A panic while holding the lock leaves `Active` consistent (every field is updated
        // after the write it describes), so poisoning is not a reason to stop spooling.
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Syncs the directory if segments were created since it was last synced (their names
    /// are durable from then on); a failure is counted and left to the next call.
    fn sync_new_names(&self) -> io::Result<()> {
        if !std::mem::take(&mut self.lock().dir_unsynced) {
            return Ok(());
        }
        sync_dir(&self.cfg.dir).inspect_err(|e| {
            self.io_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "spool: fsync of the directory failed");
            self.lock().dir_unsynced = true;
        })
    }

    /// Moves what the ring holds into the active segment (one `write(2)`, two where it wraps;
    /// a segment that would pass its size is rolled over first) and wakes the reader. The
    /// appends go on meanwhile: the lock is held only to take the range and to record it
    /// moved. A failed write is counted and cut back off the segment; its records stay in the
    /// ring for the next try.
    fn drain(&self) -> io::Result<()> {
        let Some(ring) = &self.ring else {
            return Ok(());
        };
        let _one = self.drain.lock().unwrap_or_else(|p| p.into_inner());
        let (file, len, from, to) = {
            let mut a = self.lock();
            let (from, to) = (a.ring_tail, a.ring_head);
            if from == to {
                return Ok(());
            }
            if a.len + (to - from) > self.cfg.segment_bytes {
                self.rotate(&mut a).inspect_err(|_| {
                    self.io_errors.fetch_add(1, Ordering::Relaxed);
                })?;
            }
            (a.file.clone(), a.len, from, to)
        };
        // SAFETY: `[from, to)` stays as it is until the tail passes it, below: appends write
        // only ahead of the head, within what the tail leaves free.
        let (first, second) = unsafe { ring.slices(from, to) };
        let written = (&*file)
            .write_all(first)
            .and_then(|()| (&*file).write_all(second));
        if let Err(e) = written {
            self.io_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "spool: moving records from the ring into a segment failed");
            // Never leave part of a record in front of the next one.
            let _ = file.set_len(len);
            return Err(e);
        }
        let n = to - from;
        let mut a = self.lock();
        a.len += n;
        a.ring_tail = to;
        ring.set_tail(to);
        self.disk_bytes.fetch_add(n, Ordering::Relaxed);
        drop(a);
        self.data.notify_one();
        Ok(())
    }

    /// Starts the next segment. The full one is handed to the flusher for its fsync, the new
    /// one's name is synced by the flusher with its first records: no append waits for a
    /// disk flush.
    fn rotate(&self, a: &mut Active) -> io::Result<()> {
        let file = new_segment(&self.cfg.dir, a.seq + 1)?;
        a.seq += 1;
        let full = std::mem::replace(&mut a.file, Arc::new(file));
        a.retired.push(full);
        a.dir_unsynced = true;
        self.flush.notify_one();
        a.len = MAGIC_LEN;
        self.disk_bytes.fetch_add(MAGIC_LEN, Ordering::Relaxed);
        Ok(())
    }
}

/// The writing side; cheap to share behind an `Arc`.
pub struct Spool {
    shared: Arc<Shared>,
    flusher: Mutex<Option<std::thread::JoinHandle<()>>>,
    _lock: File,
}

/// Records of one `append_batch` on their way into the file.
struct Batched {
    buf: Vec<u8>,
    /// Indexes (in `results`) of the records in `buf`.
    waiting: Vec<usize>,
    results: Vec<Result<(), AppendError>>,
}

impl Spool {
    /// Opens (or creates) the spool in `cfg.dir`: locks the directory, checks every segment and
    /// cuts off torn or corrupt tails, drops segments the reader has fully committed, and starts
    /// a new segment for this process's appends. Returns the spool and its only reader.
    pub fn open(cfg: SpoolConfig) -> io::Result<(Arc<Spool>, Reader, Recovery)> {
        cfg.validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let dir = cfg.dir.clone();
        fs::create_dir_all(&dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK))?;
        if lock.try_lock().is_err() {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("spool {} is in use by another process", dir.display()),
            ));
        }
        let (pos, mut report, mut disk, next) = recover::recover(&dir)?;
        let boot = ring::boot_id();
        let file = new_segment(&dir, next)?;
        let mut len = MAGIC_LEN;
        // What an earlier process's ring still held goes first, into this process's first
        // segment, made durable before the ring is made anew.
        if let Some(left) = ring::Ring::leftover(&dir, boot)? {
            let (moved, records) = move_leftover(&file, &left.bytes)?;
            len += moved;
            report.ring_moved = records;
            report.pending += records;
            report.ring_discarded = left.discarded;
            let cut = left.bytes.len() as u64 - moved;
            report.cut_bytes += cut;
            if cut > 0 || left.discarded > 0 {
                tracing::warn!(
                    moved = records,
                    cut,
                    discarded = left.discarded,
                    "spool: the staging ring held records not trusted (corrupt, or from before a reboot)"
                );
            }
        }
        disk += len;
        let cap = cfg.ring_cap();
        let ring = match boot {
            Some(boot) if cap > 0 => ring::Ring::create(&dir, cap, boot)
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "spool: cannot make the staging ring; appending with write(2)");
                })
                .ok(),
            _ => None,
        };
        if ring.is_none() {
            match fs::remove_file(dir.join(ring::RING)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        let shared = Arc::new(Shared {
            cfg,
            ring,
            drain: Mutex::new(()),
            active: Mutex::new(Active {
                seq: next,
                file: Arc::new(file),
                len,
                ring_head: 0,
                ring_tail: 0,
                unsynced: 0,
                first_unsynced: None,
                retired: Vec::new(),
                dir_unsynced: true,
                closed: false,
            }),
            flush: Condvar::new(),
            data: tokio::sync::Notify::new(),
            pending: report.pending.into(),
            disk_bytes: disk.into(),
            refused_full: 0.into(),
            io_errors: 0.into(),
            corrupt_skipped: 0.into(),
        });
        let flusher = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("spool-fsync".into())
                .spawn(move || flush_loop(&shared))?
        };
        let reader = Reader {
            shared: shared.clone(),
            cursor: pos,
            committed: pos,
            open: None,
            durable: pos,
            durable_at: Instant::now(),
        };
        Ok((
            Arc::new(Spool {
                shared,
                flusher: Mutex::new(Some(flusher)),
                _lock: lock,
            }),
            reader,
            report,
        ))
    }

    /// fsyncs every record appended so far (moved out of the ring first; the active segment
    /// and any rolled-over one the flusher has not synced yet).
    pub fn sync(&self) -> io::Result<()> {
        self.shared.drain()?;
        let files: Vec<Arc<File>> = {
            let a = self.shared.lock();
            a.retired.iter().cloned().chain([a.file.clone()]).collect()
        };
        for f in files {
            f.sync_data().inspect_err(|_| {
                self.shared.io_errors.fetch_add(1, Ordering::Relaxed);
            })?;
        }
        self.shared.sync_new_names()
    }

    /// Appends one record. Returns once it is in the ring (or, without one, in the file);
    /// fsync follows in the background.
    pub fn append(&self, payload: &[u8]) -> Result<(), AppendError> {
        match &self.shared.ring {
            Some(ring) => self.append_to_ring(ring, payload),
            None => self
                .append_batch(&[payload])
                .pop()
                .expect("one result per record"),
        }
    }

    /// A record into the ring under the lock: the copy and two counters. A full ring (the
    /// flusher behind, say on a disk that stalls its fsyncs) is moved into the segment here,
    /// once, and the copy tried again.
    fn append_to_ring(&self, ring: &ring::Ring, payload: &[u8]) -> Result<(), AppendError> {
        let s = &self.shared;
        if payload.is_empty() || payload.len() > MAX_RECORD {
            return Err(AppendError::Size);
        }
        let size = (HEADER + payload.len()) as u64;
        for _ in 0..2 {
            let mut a = s.lock();
            if a.closed {
                return Err(AppendError::Closed);
            }
            let held = a.ring_head - a.ring_tail;
            if s.disk_bytes.load(Ordering::Relaxed) + held + size > s.cfg.max_bytes {
                s.refused_full.fetch_add(1, Ordering::Relaxed);
                return Err(AppendError::Full);
            }
            if held + size <= ring.cap() {
                // SAFETY: under the lock, at the head, within what the tail leaves free.
                unsafe { ring.put(a.ring_head, payload) };
                a.ring_head += size;
                ring.set_head(a.ring_head);
                self.appended(&mut a, 0, 1);
                let flush_now = a.unsynced >= s.cfg.fsync_records;
                drop(a);
                self.wake(flush_now, true);
                return Ok(());
            }
            drop(a);
            s.drain()?;
        }
        Err(AppendError::Io(io::Error::other(
            "spool ring still full after moving it into a segment",
        )))
    }

    /// Accounts for `n` records of `bytes` just written at the end of the active segment (0
    /// bytes: into the ring).
    fn appended(&self, a: &mut Active, bytes: u64, n: usize) {
        let s = &self.shared;
        a.len += bytes;
        a.unsynced += n;
        a.first_unsynced.get_or_insert_with(Instant::now);
        s.disk_bytes.fetch_add(bytes, Ordering::Relaxed);
        s.pending.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// After an append, with the lock released: the flusher if enough records wait for their
    /// fsync, the reader if anything was written.
    fn wake(&self, flush_now: bool, wrote: bool) {
        if flush_now {
            self.shared.flush.notify_one();
        }
        if wrote {
            self.shared.data.notify_one();
        }
    }

    /// Appends records in order (into the ring one by one, or without one with one
    /// `write(2)` per segment touched); one result per record. Returns once the accepted ones
    /// are in the ring or the file.
    pub fn append_batch(&self, payloads: &[&[u8]]) -> Vec<Result<(), AppendError>> {
        let s = &self.shared;
        if let Some(ring) = &s.ring {
            return payloads
                .iter()
                .map(|p| self.append_to_ring(ring, p))
                .collect();
        }
        let mut out = Batched {
            buf: Vec::new(),
            waiting: Vec::new(),
            results: Vec::with_capacity(payloads.len()),
        };
        let mut a = s.lock();
        for p in payloads {
            if p.is_empty() || p.len() > MAX_RECORD {
                out.results.push(Err(AppendError::Size));
                continue;
            }
            if a.closed {
                out.results.push(Err(AppendError::Closed));
                continue;
            }
            let size = (HEADER + p.len()) as u64;
            let queued = out.buf.len() as u64;
            if s.disk_bytes.load(Ordering::Relaxed) + queued + size > s.cfg.max_bytes {
                s.refused_full.fetch_add(1, Ordering::Relaxed);
                out.results.push(Err(AppendError::Full));
                continue;
            }
            if a.len + queued + size > s.cfg.segment_bytes {
                self.write_out(&mut a, &mut out);
                if let Err(e) = s.rotate(&mut a) {
                    s.io_errors.fetch_add(1, Ordering::Relaxed);
                    out.results.push(Err(e.into()));
                    continue;
                }
            }
            encode_into(&mut out.buf, p);
            out.waiting.push(out.results.len());
            out.results.push(Ok(()));
        }
        let wrote = self.write_out(&mut a, &mut out);
        let flush_now = a.unsynced >= s.cfg.fsync_records;
        drop(a);
        self.wake(flush_now, wrote);
        out.results
    }

    /// Writes what `out` has queued in one call; marks its records failed if that fails.
    fn write_out(&self, a: &mut Active, out: &mut Batched) -> bool {
        if out.buf.is_empty() {
            return false;
        }
        let s = &self.shared;
        let n = out.waiting.len();
        let bytes = out.buf.len() as u64;
        let written = (&*a.file).write_all(&out.buf);
        out.buf.clear();
        match written {
            Ok(()) => {
                self.appended(a, bytes, n);
                out.waiting.clear();
                true
            }
            Err(e) => {
                s.io_errors.fetch_add(1, Ordering::Relaxed);
                // Never leave part of a record in front of the next one.
                let _ = a.file.set_len(a.len);
                for i in out.waiting.drain(..) {
                    out.results[i] = Err(io::Error::new(e.kind(), e.to_string()).into());
                }
                false
            }
        }
    }

    /// Refuses further appends, moves what the ring holds into the segment and fsyncs
    /// everything (graceful shutdown). Idempotent.
    pub fn close(&self) {
        self.shared.lock().closed = true;
        self.shared.flush.notify_one();
        let handle = self
            .flusher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        self.shared.data.notify_one();
    }

    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        Stats {
            pending: s.pending.load(Ordering::Relaxed),
            disk_bytes: s.disk_bytes.load(Ordering::Relaxed),
            refused_full: s.refused_full.load(Ordering::Relaxed),
            io_errors: s.io_errors.load(Ordering::Relaxed),
            corrupt_skipped: s.corrupt_skipped.load(Ordering::Relaxed),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.shared.cfg.dir
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.close();
    }
}

/// Writes the whole records at the start of `bytes` (an earlier process's ring, see
/// [`ring::Ring::leftover`]) to `file` and makes them durable; returns the bytes and records
/// written. Whatever follows the first record that does not check out is not written.
fn move_leftover(file: &File, bytes: &[u8]) -> io::Result<(u64, u64)> {
    let mut valid = 0;
    let mut records = 0;
    while let Ok(Some((_, size))) = decode(&bytes[valid..]) {
        valid += size;
        records += 1;
    }
    if valid > 0 {
        let mut f = file;
        f.write_all(&bytes[..valid])?;
        file.sync_data()?;
    }
    Ok((valid as u64, records))
}

fn flush_loop(s: &Shared) {
    let interval = s.cfg.fsync_interval;
    let mut a = s.lock();
    loop {
        let idle = a.unsynced == 0 && a.retired.is_empty() && a.ring_head == a.ring_tail;
        if idle {
            if a.closed {
                return;
            }
            a = s.flush.wait(a).unwrap_or_else(|p| p.into_inner());
            continue;
        }
        let due = a.first_unsynced.unwrap_or_else(Instant::now) + interval;
        let now = Instant::now();
        if a.retired.is_empty() && a.unsynced < s.cfg.fsync_records && now < due && !a.closed {
            a = s
                .flush
                .wait_timeout(a, due - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            continue;
        }
        a.unsynced = 0;
        a.first_unsynced = None;
        drop(a);
        // The ring's records into the segment, then every file with records not yet synced:
        // rolled-over segments first (older records), then the active one.
        let moved = s.drain();
        let files: Vec<Arc<File>> = {
            let mut a = s.lock();
            let mut files = std::mem::take(&mut a.retired);
            files.push(a.file.clone());
            files
        };
        for file in files {
            if let Err(e) = file.sync_data() {
                s.io_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "spool: fsync failed");
            }
        }
        // After the records: the names of segments created since the last round.
        let _ = s.sync_new_names();
        a = s.lock();
        if moved.is_err() {
            if a.closed {
                // Left in the ring: the next open moves it.
                return;
            }
            // Tried again after an interval.
            a.unsynced = a.unsynced.max(1);
            a.first_unsynced.get_or_insert_with(Instant::now);
        }
    }
}
