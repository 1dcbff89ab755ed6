//! The spool's one reader: a cursor over the segments, a durable committed position.

use super::*;

/// A batch of records read from the spool, and where it ends.
#[derive(Debug, Default)]
pub struct Batch {
    pub records: Vec<Vec<u8>>,
    pub end: Option<Position>,
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
        let mut bytes = 0;
        let dir = self.shared.cfg.dir.clone();
        while batch.records.len() < max_records && bytes < max_bytes {
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
            let mut buf = vec![0; want];
            file.read_exact_at(&mut buf, self.cursor.offset)?;
            let mut off = 0;
            let mut progressed = false;
            while batch.records.len() < max_records && bytes < max_bytes {
                match decode(&buf[off..]) {
                    Ok(Some((payload, size))) => {
                        batch.records.push(payload.to_vec());
                        bytes += payload.len();
                        off += size;
                        progressed = true;
                    }
                    // The end of the data, or a record that goes on past this chunk.
                    Ok(None) if off == buf.len() || (want == CHUNK && progressed) => break,
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
            self.cursor.offset += off as u64;
            if off == 0 {
                break;
            }
        }
        batch.end = (self.cursor != self.committed).then_some(self.cursor);
        Ok(batch)
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

    /// Like [`Self::commit`], but the position reaches the disk only if the last durable write
    /// is `min_interval` old or segments can be deleted; [`Self::persist`] forces it (when
    /// idle, on shutdown). Blocking file I/O when it writes.
    pub fn commit_relaxed(&mut self, batch: &Batch, min_interval: Duration) -> io::Result<()> {
        self.advance(batch);
        if self.committed.segment > self.durable.segment
            || self.durable_at.elapsed() >= min_interval
        {
            self.persist()
        } else {
            Ok(())
        }
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
    fn advance(&mut self, batch: &Batch) {
        let Some(end) = batch.end else { return };
        if end <= self.committed {
            return;
        }
        self.committed = end;
        let n = batch.records.len() as u64;
        let _ = self
            .shared
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                Some(p.saturating_sub(n))
            });
    }
}
