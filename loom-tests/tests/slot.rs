//! Models a backend slot's client cell (`exec::upstream::slot::SlotCell`): the control
//! plane replaces the value (a slot filled with a new address) while a worker takes the
//! current one at the start of each batch. What must hold: a reader sees a whole value
//! (here a pair whose halves agree), the old or the new, and once it saw the new it never
//! sees the old again; the writer's value is the one left.
#![cfg(feature = "loom")]

use abe::exec::upstream::SlotCell;
use loom::thread;
use loom_tests::model;

#[test]
fn a_reader_sees_whole_values_and_never_goes_back() {
    model(|| {
        let cell = SlotCell::new((1u32, 1u32));
        let writer = {
            let cell = cell.clone();
            thread::spawn(move || cell.replace((2, 2)))
        };
        let first = cell.current();
        let second = cell.current();
        for (a, b) in [first, second] {
            assert_eq!(a, b, "a torn value");
            assert!(a == 1 || a == 2);
        }
        assert!(second.0 >= first.0, "went back to the old value");
        writer.join().unwrap();
        assert_eq!(cell.current(), (2, 2));
    });
}
