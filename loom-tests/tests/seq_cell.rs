//! Models the lock-free read of a small value (`runtime::seq_cell::SeqCell`, the injected
//! fault settings every io thread reads per request): a writer replaces the value while a
//! reader reads it. What must hold: a read that succeeds returns one whole value, the old
//! or the new (here all words equal), and once it saw the new it never sees the old; a
//! read that fails raced a write; after the writer is done a read succeeds with its value.
#![cfg(feature = "loom")]

use abe::runtime::seq_cell::SeqCell;
use loom::sync::Arc;
use loom::thread;
use loom_tests::model;

#[test]
fn a_read_sees_one_whole_value_and_never_goes_back() {
    model(|| {
        let cell = Arc::new(SeqCell::new([1u64, 1, 1]));
        let writer = {
            let cell = cell.clone();
            thread::spawn(move || cell.write([2, 2, 2]))
        };
        let mut newest = 1;
        for _ in 0..2 {
            if let Some(v) = cell.try_read() {
                assert!(v == [1, 1, 1] || v == [2, 2, 2], "torn: {v:?}");
                assert!(v[0] >= newest, "went back to the old value");
                newest = v[0];
            }
        }
        writer.join().unwrap();
        assert_eq!(cell.try_read(), Some([2, 2, 2]));
    });
}

#[test]
fn two_writers_leave_one_of_their_values_whole() {
    model(|| {
        let cell = Arc::new(SeqCell::new([0u64, 0]));
        let other = {
            let cell = cell.clone();
            thread::spawn(move || cell.write([1, 1]))
        };
        cell.write([2, 2]);
        if let Some(v) = cell.try_read() {
            assert!(v == [2, 2] || v == [1, 1], "torn: {v:?}");
        }
        other.join().unwrap();
        let v = cell.try_read().expect("no write under way");
        assert!(v == [1, 1] || v == [2, 2], "torn: {v:?}");
    });
}
