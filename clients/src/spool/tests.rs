use super::format::list_segments;
use super::*;

fn cfg(dir: &Path) -> SpoolConfig {
    SpoolConfig {
        segment_bytes: 2 * (MAX_RECORD as u64 + HEADER as u64),
        max_bytes: 64 * 1024 * 1024,
        ..SpoolConfig::new(dir)
    }
}

fn rec(i: usize) -> Vec<u8> {
    format!("record-{i:05}").into_bytes()
}

fn read_all(r: &mut Reader) -> (Vec<Vec<u8>>, Batch) {
    let mut out = Vec::new();
    let mut last = Batch::default();
    loop {
        let b = r.read(7, 1 << 20).unwrap();
        if b.is_empty() {
            last.end = b.end.or(last.end);
            return (out, last);
        }
        out.extend(b.to_vecs());
        last.end = b.end;
    }
}

fn last_segment(dir: &Path) -> PathBuf {
    segment_path(dir, *list_segments(dir).unwrap().last().unwrap())
}

#[test]
fn records_come_back_in_order_once_committed_and_again_if_not() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (spool, mut r, rec0) = Spool::open(cfg(dir.path())).unwrap();
        assert_eq!(rec0.pending, 0);
        for i in 0..20 {
            spool.append(&rec(i)).unwrap();
        }
        let first = r.read(5, 1 << 20).unwrap();
        assert_eq!(first.to_vecs(), (0..5).map(rec).collect::<Vec<_>>());
        r.commit(&first).unwrap();
        // Read but not committed: a crash here must deliver 5..20 again.
        let (rest, _) = read_all(&mut r);
        assert_eq!(rest.len(), 15);
        assert_eq!(spool.stats().pending, 15);
    }
    let (spool, mut r, rec1) = Spool::open(cfg(dir.path())).unwrap();
    assert_eq!((rec1.pending, rec1.cut_bytes), (15, 0));
    spool.append(&rec(20)).unwrap();
    let (all, last) = read_all(&mut r);
    assert_eq!(all, (5..21).map(rec).collect::<Vec<_>>());
    let done = Batch::of(&all, last.end);
    r.commit(&done).unwrap();
    assert_eq!(spool.stats().pending, 0);
    drop((spool, r));
    let (_s, mut r, rec2) = Spool::open(cfg(dir.path())).unwrap();
    assert_eq!(rec2.pending, 0);
    assert!(read_all(&mut r).0.is_empty());
}

#[test]
fn a_torn_tail_is_cut_off_and_the_records_before_it_survive() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (spool, _r, _) = Spool::open(cfg(dir.path())).unwrap();
        for i in 0..10 {
            spool.append(&rec(i)).unwrap();
        }
    }
    // A crash in the middle of a write: half a record at the end.
    let seg = last_segment(dir.path());
    let good = fs::metadata(&seg).unwrap().len();
    let torn = encode(&rec(99));
    OpenOptions::new()
        .append(true)
        .open(&seg)
        .unwrap()
        .write_all(&torn[..torn.len() / 2])
        .unwrap();
    let (_s, mut r, report) = Spool::open(cfg(dir.path())).unwrap();
    assert_eq!(report.pending, 10);
    assert_eq!(report.cut_bytes, torn.len() as u64 / 2);
    assert_eq!(fs::metadata(&seg).unwrap().len(), good);
    assert_eq!(read_all(&mut r).0, (0..10).map(rec).collect::<Vec<_>>());
}

#[test]
fn a_corrupt_record_and_everything_after_it_are_cut_never_delivered() {
    for garbage in [
        Garbage::FlipPayloadBit,
        Garbage::Zeroes,
        Garbage::HugeLength,
    ] {
        let dir = tempfile::tempdir().unwrap();
        {
            let (spool, _r, _) = Spool::open(cfg(dir.path())).unwrap();
            for i in 0..10 {
                spool.append(&rec(i)).unwrap();
            }
        }
        let seg = last_segment(dir.path());
        let mut bytes = fs::read(&seg).unwrap();
        let size = encode(&rec(0)).len();
        let sixth = MAGIC.len() + 6 * size;
        match garbage {
            Garbage::FlipPayloadBit => bytes[sixth + HEADER + 3] ^= 0x10,
            // A zeroed block with records after it (an all-zero tail is a preallocated
            // segment's unused rest: see the next test).
            Garbage::Zeroes => bytes[sixth..sixth + size].fill(0),
            Garbage::HugeLength => bytes[sixth..sixth + 4].copy_from_slice(&u32::MAX.to_le_bytes()),
        }
        fs::write(&seg, &bytes).unwrap();
        let (_s, mut r, report) = Spool::open(cfg(dir.path())).unwrap();
        assert_eq!(report.pending, 6, "{garbage:?}");
        assert_eq!(report.cut_bytes, 4 * size as u64, "{garbage:?}");
        assert_eq!(read_all(&mut r).0, (0..6).map(rec).collect::<Vec<_>>());
    }
}

/// A spool whose flusher waits (almost) for ever: what is appended stays in the ring until the
/// reader, a full ring, `sync` or `close` moves it.
fn lazy(dir: &Path) -> SpoolConfig {
    SpoolConfig {
        fsync_records: 1 << 30,
        fsync_interval: Duration::from_secs(3600),
        ..cfg(dir)
    }
}

/// Copies the spool's files as they are now: what a SIGKILL of its writer leaves.
fn snapshot(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_name() != LOCK {
            fs::copy(e.path(), copy.path().join(e.file_name())).unwrap();
        }
    }
    copy
}

const RING_DATA: u64 = 4096;

#[test]
fn a_crashed_writers_records_survive_in_its_ring_and_reach_a_segment_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let (spool, _r, _) = Spool::open(lazy(dir.path())).unwrap();
    for i in 0..10 {
        spool.append(&rec(i)).unwrap();
    }
    let seg = last_segment(dir.path());
    let size = encode(&rec(0)).len() as u64;
    // Appends are copies into the mapped ring: the segment has none of them yet (no write(2),
    // no fsync), the ring file has them all.
    assert_eq!(fs::metadata(&seg).unwrap().len(), MAGIC_LEN);
    let crashed = snapshot(dir.path());
    let (_s, mut r, report) = Spool::open(lazy(crashed.path())).unwrap();
    assert_eq!(
        (report.ring_moved, report.pending, report.cut_bytes),
        (10, 10, 0)
    );
    assert_eq!(read_all(&mut r).0, (0..10).map(rec).collect::<Vec<_>>());
    drop((_s, r));
    // Moved once: opened again, the same records are pending in the segment, not twice.
    let (_s, mut r, report) = Spool::open(lazy(crashed.path())).unwrap();
    assert_eq!((report.ring_moved, report.pending), (0, 10));
    assert_eq!(read_all(&mut r).0, (0..10).map(rec).collect::<Vec<_>>());

    // A bit flipped in the ring's 6th record: the five before it are moved, the rest is cut
    // and counted, never delivered.
    let flipped = snapshot(dir.path());
    let ring_path = flipped.path().join(ring::RING);
    let f = OpenOptions::new().write(true).open(&ring_path).unwrap();
    f.write_all_at(b"X", RING_DATA + 5 * size + HEADER as u64 + 2)
        .unwrap();
    let (_s, mut r, report) = Spool::open(lazy(flipped.path())).unwrap();
    assert_eq!(
        (report.ring_moved, report.pending, report.cut_bytes),
        (5, 5, 5 * size)
    );
    assert_eq!(read_all(&mut r).0, (0..5).map(rec).collect::<Vec<_>>());

    // The ring of another boot (the machine restarted, perhaps after a power loss that left
    // its pages half written back) is not trusted: nothing moved, its bytes reported.
    let rebooted = snapshot(dir.path());
    let f = OpenOptions::new()
        .write(true)
        .open(rebooted.path().join(ring::RING))
        .unwrap();
    f.write_all_at(&[0xAB; 16], 16).unwrap();
    let (_s, mut r, report) = Spool::open(lazy(rebooted.path())).unwrap();
    assert_eq!(
        (report.ring_moved, report.pending, report.ring_discarded),
        (0, 0, 10 * size)
    );
    assert!(read_all(&mut r).0.is_empty());

    // A crash in the middle of a move into the segment: half a record after the last whole
    // one. The half record is cut and counted; the ring, whose tail never passed the
    // records, moves them again (delivered twice, never lost).
    spool.sync().unwrap();
    let torn_dir = snapshot(dir.path());
    let f = OpenOptions::new()
        .write(true)
        .open(torn_dir.path().join(seg.file_name().unwrap()))
        .unwrap();
    let torn = encode(&rec(99));
    f.write_all_at(&torn[..torn.len() / 2], MAGIC_LEN + 10 * size)
        .unwrap();
    let (_s, mut r, report) = Spool::open(lazy(torn_dir.path())).unwrap();
    assert_eq!(
        (report.pending, report.cut_bytes, report.ring_moved),
        (10, torn.len() as u64 / 2, 0)
    );
    assert_eq!(read_all(&mut r).0, (0..10).map(rec).collect::<Vec<_>>());

    // A graceful close leaves the segment with every record and the ring empty.
    spool.append(&rec(10)).unwrap();
    spool.close();
    assert_eq!(fs::metadata(&seg).unwrap().len(), MAGIC_LEN + 11 * size);
    drop(spool);
    let (_s, _r, report) = Spool::open(lazy(dir.path())).unwrap();
    assert_eq!((report.ring_moved, report.pending), (0, 11));
}

#[test]
fn a_full_ring_moves_itself_and_wraps_keeping_every_record_in_order() {
    let dir = tempfile::tempdir().unwrap();
    // The smallest ring (one largest record); the flusher never runs on its own.
    let c = SpoolConfig {
        ring_bytes: (MAX_RECORD + HEADER) as u64,
        ..lazy(dir.path())
    };
    let (spool, mut r, _) = Spool::open(c.clone()).unwrap();
    let recs: Vec<Vec<u8>> = (0..200)
        .map(|i| vec![(i % 251) as u8; 997 + 13 * i])
        .collect();
    let mut got = Vec::new();
    for (i, p) in recs.iter().enumerate() {
        spool.append(p).unwrap();
        if i == 150 {
            // A crash here: whatever the ring holds now comes back at the next open.
            let crashed = snapshot(dir.path());
            let (_s, mut r2, _) = Spool::open(SpoolConfig {
                dir: crashed.path().to_path_buf(),
                ..c.clone()
            })
            .unwrap();
            // Nothing was committed: every record so far, from the segments and the ring.
            assert_eq!(read_all(&mut r2).0, recs[..=150].to_vec());
            drop((_s, r2));
        }
        if i % 40 == 0 {
            got.extend(read_all(&mut r).0);
        }
    }
    got.extend(read_all(&mut r).0);
    assert_eq!(got, recs);
    assert_eq!(spool.stats().io_errors, 0);
}

#[test]
fn without_a_ring_every_append_is_in_the_segment_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = SpoolConfig {
        ring_bytes: 0,
        ..lazy(dir.path())
    };
    let (spool, mut r, _) = Spool::open(c.clone()).unwrap();
    assert!(!dir.path().join(ring::RING).exists());
    for i in 0..10 {
        spool.append(&rec(i)).unwrap();
    }
    let size = encode(&rec(0)).len() as u64;
    assert_eq!(
        fs::metadata(last_segment(dir.path())).unwrap().len(),
        MAGIC_LEN + 10 * size
    );
    assert_eq!(read_all(&mut r).0, (0..10).map(rec).collect::<Vec<_>>());
    drop((spool, r));
    // A spool that had a ring, opened without one: its records are moved, the file removed.
    let (spool, _r, _) = Spool::open(lazy(dir.path())).unwrap();
    spool.append(&rec(10)).unwrap();
    let crashed = snapshot(dir.path());
    drop(spool);
    let (_s, mut r, report) = Spool::open(SpoolConfig {
        dir: crashed.path().to_path_buf(),
        ..c
    })
    .unwrap();
    assert_eq!(report.ring_moved, 1);
    assert!(!crashed.path().join(ring::RING).exists());
    assert_eq!(read_all(&mut r).0, (0..11).map(rec).collect::<Vec<_>>());
}

#[derive(Debug, Clone, Copy)]
enum Garbage {
    FlipPayloadBit,
    Zeroes,
    HugeLength,
}

#[test]
fn segments_rotate_and_are_deleted_once_committed() {
    let dir = tempfile::tempdir().unwrap();
    let (spool, mut r, _) = Spool::open(cfg(dir.path())).unwrap();
    let big = vec![7u8; 10_000];
    for _ in 0..60 {
        spool.append(&big).unwrap();
    }
    assert!(list_segments(dir.path()).unwrap().len() >= 4);
    let mut n = 0;
    loop {
        let b = r.read(16, 1 << 20).unwrap();
        if b.is_empty() {
            break;
        }
        n += b.len();
        r.commit(&b).unwrap();
    }
    assert_eq!(n, 60);
    assert_eq!(list_segments(dir.path()).unwrap().len(), 1);
    // Closed, the segments hold every byte the spool counts (the ring is not counted).
    spool.close();
    let st = spool.stats();
    assert_eq!(st.pending, 0);
    assert_eq!(
        st.disk_bytes,
        fs::metadata(last_segment(dir.path())).unwrap().len()
    );
}

#[test]
fn a_full_spool_refuses_new_records_and_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let c = SpoolConfig {
        max_bytes: 2 * cfg(dir.path()).segment_bytes,
        ..cfg(dir.path())
    };
    let (spool, mut r, _) = Spool::open(c).unwrap();
    let big = vec![1u8; 30_000];
    let mut stored = 0;
    loop {
        match spool.append(&big) {
            Ok(()) => stored += 1,
            Err(AppendError::Full) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(matches!(spool.append(&big), Err(AppendError::Full)));
    assert_eq!(spool.stats().refused_full, 2);
    let mut got = 0;
    loop {
        let b = r.read(100, 1 << 20).unwrap();
        if b.is_empty() {
            break;
        }
        got += b.len();
        r.commit(&b).unwrap();
    }
    assert_eq!(got, stored);
    spool.append(&big).unwrap();
    assert!(matches!(spool.append(&[]), Err(AppendError::Size)));
    assert!(matches!(
        spool.append(&vec![0; MAX_RECORD + 1]),
        Err(AppendError::Size)
    ));
}

#[test]
fn foreign_files_in_the_spool_directory_are_ignored_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "99999999999999999999.seg", // 20 digits above u64::MAX
        "1.seg",
        "abc.seg",
        "00000000000000000001.seg.tmp",
        "notes.txt",
    ] {
        fs::write(dir.path().join(name), b"junk").unwrap();
    }
    let (spool, mut r, _) = Spool::open(cfg(dir.path())).unwrap();
    spool.append(&rec(1)).unwrap();
    spool.close();
    assert_eq!(read_all(&mut r).0, vec![rec(1)]);
}

#[test]
fn one_process_per_spool_and_closed_means_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (spool, _r, _) = Spool::open(cfg(dir.path())).unwrap();
    assert!(Spool::open(cfg(dir.path())).is_err());
    spool.close();
    assert!(matches!(spool.append(b"x"), Err(AppendError::Closed)));
}

#[test]
fn a_reader_racing_a_writer_sees_every_record_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (spool, mut r, _) = Spool::open(cfg(dir.path())).unwrap();
    let writer = {
        let spool = spool.clone();
        std::thread::spawn(move || {
            for i in 0..5000 {
                spool.append(&rec(i)).unwrap();
            }
        })
    };
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 5000 && Instant::now() < deadline {
        let b = r.read(333, 1 << 20).unwrap();
        got.extend(b.to_vecs());
        r.commit(&b).unwrap();
    }
    writer.join().unwrap();
    assert_eq!(got, (0..5000).map(rec).collect::<Vec<_>>());
}

#[test]
fn relaxed_commits_reach_the_disk_when_due_or_persisted_and_a_crash_resends_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (spool, mut r, _) = Spool::open(cfg(dir.path())).unwrap();
        for i in 0..30 {
            spool.append(&rec(i)).unwrap();
        }
        let first = r.read(10, 1 << 20).unwrap();
        // Due at once (zero interval): on disk.
        r.commit_relaxed(&first, Duration::ZERO).unwrap();
        assert!(!r.unpersisted());
        let second = r.read(10, 1 << 20).unwrap();
        // Not due: in memory only, but counted done.
        r.commit_relaxed(&second, Duration::from_secs(3600))
            .unwrap();
        assert!(r.unpersisted());
        assert_eq!(spool.stats().pending, 10);
    }
    // A crash before the position was persisted: 10..30 come again (ids make it harmless).
    {
        let (_spool, mut r, recovered) = Spool::open(cfg(dir.path())).unwrap();
        assert_eq!(recovered.pending, 20);
        let (all, last) = read_all(&mut r);
        assert_eq!(all, (10..30).map(rec).collect::<Vec<_>>());
        let done = Batch::of(&all, last.end);
        r.commit_relaxed(&done, Duration::from_secs(3600)).unwrap();
        r.persist().unwrap();
        assert!(!r.unpersisted());
    }
    let (_spool, _r, recovered) = Spool::open(cfg(dir.path())).unwrap();
    assert_eq!(recovered.pending, 0);
}

#[test]
fn filesystem_space_reads_the_spool_directorys_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let fs = filesystem_space(dir.path()).unwrap();
    assert!(fs.size > 0 && fs.free <= fs.size, "{fs:?}");
    assert!(filesystem_space(&dir.path().join("missing")).is_err());
}

#[test]
fn a_kept_batch_is_refilled_in_place_across_chunks_and_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (spool, mut r, _) = Spool::open(cfg(dir.path())).unwrap();
    // Records of odd sizes, so that reads end inside records at chunk and segment ends.
    let big = |i: usize| {
        let mut v = rec(i);
        v.resize(1000 + (i * 7919) % 60_000, b'a' + (i % 26) as u8);
        v
    };
    let n = 120;
    for i in 0..n {
        spool.append(&big(i)).unwrap();
    }
    let mut batch = Batch::default();
    let mut got = Vec::new();
    let mut capacity = 0;
    for _ in 0..n {
        r.read_into(&mut batch, 9, 300_000).unwrap();
        if batch.is_empty() {
            break;
        }
        assert_eq!(
            batch.bytes(),
            batch.records().map(<[u8]>::len).sum::<usize>()
        );
        got.extend(batch.to_vecs());
        r.commit(&batch).unwrap();
        capacity = capacity.max(batch.data.capacity());
    }
    // One buffer for all rounds, bounded by a batch and a chunk, not by what went through.
    assert!(
        capacity <= 2 * (300_000 + MAX_RECORD + HEADER + CHUNK),
        "{capacity}"
    );
    assert_eq!(got.len(), n);
    assert!(got.iter().enumerate().all(|(i, g)| *g == big(i)));
    // Nothing left: an empty batch, its old records gone.
    r.read_into(&mut batch, 9, 300_000).unwrap();
    assert!(batch.is_empty() && batch.get(0).is_none() && batch.bytes() == 0);
}
