//! The spool's one reader: a cursor over the segments, a durable committed position.

use super::*;

/// A batch of records read from the spool, and where it ends. The records lie in one buffer
/// as the segment holds them (read straight from the file, no copy per record), so a batch
/// kept and refilled with [`Reader::read_into`] costs no allocation once it has grown: a
/// replayer that allocated and freed its 2 MiB every round had glibc return the memory and
/// fault it in again each time (0.1-0.2 page faults per redirect of a hot tier).
#[derive(Debug, Default)]
pub struct Batch {
    /// The file's bytes: record headers and payloads.
    pub(super) data: Vec<u8>,
    /// Each record's payload in `data`: start and length.
    spans: Vec<(usize, usize)>,
    /// Payload bytes of the records.
    bytes: usize,
    pub end: Option<Position>,
}

impl Batch {
    /// A batch of these records (a test's or a caller's own), ending at `end`.
    pub fn of<R: AsRef<[u8]>>(records: &[R], end: Option<Position>) -> Batch {
        let mut b = Batch {
            end,
            ..Batch::default()
        };
        for r in records {
            let r = r.as_ref();
            b.spans.push((b.data.len(), r.len()));
            b.data.extend_from_slice(r);
            b.bytes += r.len();
        }
        b
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Payload bytes of all records.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.spans.get(i).map(|&(at, n)| &self.data[at..at + n])
    }

    /// The records, in spool order.
    pub fn records(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.spans.iter().map(|&(at, n)| &self.data[at..at + n])
    }

    /// The records as owned vectors (tests).
    pub fn to_vecs(&self) -> Vec<Vec<u8>> {
        self.records().map(<[u8]>::to_vec).collect()
    }

    /// Empties the batch, keeping its buffers.
    fn clear(&mut self) {
        self.data.clear();
        self.spans.clear();
        self.bytes = 0;
        self.end = None;
    }
}

/// The only reader of a spool. Reads move a cursor; [`Reader::commit`] makes a batch's end the
/// durable position, [`Reader::rewind`] goes back to the last commit (to resend after a failure).
/// [`Reader::commit_relaxed`] moves the position in memory and makes it durable at most every
/// so often (each durable write is two fsyncs): a crash then delivers again what was committed
/// since the last durable write, which record ids make harmless.
pub struct Reader {
    pub(super) shared: Arc<Shared>,
    pub(super) cursor: Position,
    pub(super) committed: Position,
    pub(super) open: Option<(u64, File)>,
    /// The position on disk, and when it was written.
    pub(super) durable: Position,
    pub(super) durable_at: Instant,
}

impl Reader {
    pub fn committed(&self) -> Position {
        self.committed
    }

    /// Waits until something may have been appended, or `timeout`.
    pub async fn wait(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.shared.data.notified()).await;
    }

    pub fn rewind(&mut self) {
        self.cursor = self.committed;
    }

    /// Reads up to `max_records` records (at most about `max_bytes` of payload) from the cursor.
    /// Blocking file I/O: call it from a blocking context.
    pub fn read(&mut self, max_records: usize, max_bytes: usize) -> io::Result<Batch> {
        let mut batch = Batch::default();
        self.read_into(&mut batch, max_records, max_bytes)?;
        Ok(batch)
    }

    /// [`Self::read`] into `batch` (emptied first), reusing its buffers.
    pub fn read_into(
        &mut self,
        batch: &mut Batch,
        max_records: usize,
        max_bytes: usize,
    ) -> io::Result<()> {
        batch.clear();
        // What the ring holds into the segment first, so a reader never waits for the
        // flusher's round (a failure is counted and logged there; what the segments hold is
        // read all the same).
        let _ = self.shared.drain();
        let dir = self.shared.cfg.dir.clone();
        while batch.len() < max_records && batch.bytes < max_bytes {
            let (active_seq, active_len) = {
                let a = self.shared.lock();
                (a.seq, a.len)
            };
            let seg = self.cursor.segment;
            if seg > active_seq {
                break;
            }
            if self.open.as_ref().map(|(s, _)| *s) != Some(seg) {
                match File::open(segment_path(&dir, seg)) {
                    Ok(f) => self.open = Some((seg, f)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound && seg < active_seq => {
                        self.next_segment();
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let (_, file) = self.open.as_ref().expect("opened above");
            let limit = if seg == active_seq {
                active_len
            } else {
                file.metadata()?.len()
            };
            if self.cursor.offset >= limit {
                if seg == active_seq {
                    break;
                }
                self.next_segment();
                continue;
            }
            let want = ((limit - self.cursor.offset) as usize).min(CHUNK);
            // The chunk goes after the records already read; what of it is not a whole
            // record taken is cut off again below.
            let start = batch.data.len();
            batch.data.resize(start + want, 0);
            if let Err(e) = file.read_exact_at(&mut batch.data[start..], self.cursor.offset) {
                batch.data.truncate(start);
                return Err(e);
            }
            let mut off = 0;
            let mut progressed = false;
            while batch.len() < max_records && batch.bytes < max_bytes {
                match decode(&batch.data[start + off..]) {
                    Ok(Some((payload, size))) => {
                        let n = payload.len();
                        batch.spans.push((start + off + HEADER, n));
                        batch.bytes += n;
                        off += size;
                        progressed = true;
                    }
                    // The end of the data, or a record that goes on past this chunk.
                    Ok(None) if off == want || (want == CHUNK && progressed) => break,
                    Ok(None) | Err(()) => {
                        // Validated at open or written by this process, yet unreadable now:
                        // something outside changed the file. Skip what cannot be trusted.
                        self.shared.corrupt_skipped.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(
                            segment = seg,
                            offset = self.cursor.offset + off as u64,
                            "spool: corrupt record in a checked segment; skipping the rest of it"
                        );
                        off = (limit - self.cursor.offset) as usize;
                        break;
                    }
                }
            }
            // Only whole records taken stay (a skipped corrupt rest is dropped, not sent).
            let kept = batch
                .spans
                .last()
                .map_or(start, |&(at, n)| (at + n).max(start));
            batch.data.truncate(kept);
            self.cursor.offset += off as u64;
            if off == 0 {
                break;
            }
        }
        batch.end = (self.cursor != self.committed).then_some(self.cursor);
        Ok(())
    }

    fn next_segment(&mut self) {
        self.cursor = Position {
            segment: self.cursor.segment + 1,
            offset: MAGIC_LEN,
        };
        self.open = None;
    }

    /// Makes `batch.end` the durable position and deletes the segments before it. Call after
    /// the batch's records were delivered, in read order. Blocking file I/O.
    pub fn commit(&mut self, batch: &Batch) -> io::Result<()> {
        self.advance(batch);
        self.persist()
    }

    /// Like [`Self::commit`], but the position reaches the disk only if
    /// [`Self::persist_due`]; [`Self::persist`] forces it (when idle, on shutdown). Blocking
    /// file I/O when it writes.
    pub fn commit_relaxed(&mut self, batch: &Batch, min_interval: Duration) -> io::Result<()> {
        self.advance(batch);
        if self.persist_due(min_interval) {
            self.persist()
        } else {
            Ok(())
        }
    }

    /// Whether a relaxed commit writes the position now: segments can be deleted, or the last
    /// durable write is `min_interval` old (and the position moved since). Without I/O: a caller
    /// that must not block checks this first and does the write elsewhere.
    pub fn persist_due(&self, min_interval: Duration) -> bool {
        self.unpersisted()
            && (self.committed.segment > self.durable.segment
                || self.durable_at.elapsed() >= min_interval)
    }

    /// Whether the committed position is ahead of the one on disk.
    pub fn unpersisted(&self) -> bool {
        self.committed > self.durable
    }

    /// Writes the committed position to disk if it moved, then deletes the segments before it.
    pub fn persist(&mut self) -> io::Result<()> {
        if self.committed <= self.durable {
            return Ok(());
        }
        let dir = &self.shared.cfg.dir;
        let end = self.committed;
        write_position(dir, end)?;
        for seq in self.durable.segment..end.segment {
            let path = segment_path(dir, seq);
            if let Ok(m) = fs::metadata(&path) {
                fs::remove_file(&path)?;
                self.shared.disk_bytes.fetch_sub(m.len(), Ordering::Relaxed);
            }
        }
        self.durable = end;
        self.durable_at = Instant::now();
        Ok(())
    }

    /// Moves the committed position (in memory) to `batch.end` and counts its records done.
    /// Nothing reaches the disk until [`Self::persist`].
    pub fn advance(&mut self, batch: &Batch) {
        let Some(end) = batch.end else { return };
        if end <= self.committed {
            return;
        }
        self.committed = end;
        let n = batch.len() as u64;
        let _ = self
            .shared
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                Some(p.saturating_sub(n))
            });
    }
}
