use super::*;

#[test]
fn slices_cover_the_ring_and_a_cursor_finds_its_slice() {
    for n in [1, 2, 7, 64, 1024] {
        assert_eq!(token_range(0, n).0, i64::MIN);
        assert_eq!(token_range(n - 1, n).1, i64::MAX);
        for i in 0..n.min(50) {
            let (from, to) = token_range(i, n);
            assert!(from <= to);
            assert_eq!(slice_of(from, n), i);
            assert_eq!(slice_of(to, n), i);
            if i + 1 < n {
                assert_eq!(to + 1, token_range(i + 1, n).0, "no gap, no overlap");
            }
        }
    }
    // A cursor written with another slice count still lands in a slice.
    assert_eq!(slice_of(token_range(3, 8).0, 4), 1);
    assert_eq!(slice_of(i64::MAX, 3), 2);
}
