//! `preserve_ordering`: responses leave in the order their batches formed, even when several
//! instances finish batches out of order. As in Triton, requests dropped from the queue
//! (timed out, cancelled) are answered at once and take no part in the order.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::queue::Reply;
use crate::engine::tensor::OutputTensor;
use crate::error::Result;

/// A request's reply channel with the answer it gets.
pub type Delivery = (Reply, Result<Vec<OutputTensor>>);

/// Finished batches waiting for the batches formed before them.
#[derive(Debug, Default)]
pub struct Reorder {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The batch whose answers go out next.
    next: u64,
    /// Finished batches after `next`, by their sequence number.
    done: BTreeMap<u64, Vec<Delivery>>,
}

impl Reorder {
    /// A ticket for the batch numbered `seq` (numbers come from the queue, one per batch).
    pub fn ticket(self: &Arc<Self>, seq: u64) -> Ticket {
        Ticket { seq, order: Some(self.clone()) }
    }

    /// Records batch `seq` as finished and sends every answer that is now in order. Sending
    /// happens under the lock so that two instances finishing together cannot interleave.
    fn finish(&self, seq: u64, answers: Vec<Delivery>) {
        let mut state = self.state.lock();
        state.done.insert(seq, answers);
        loop {
            let next = state.next;
            let Some(ready) = state.done.remove(&next) else { break };
            state.next += 1;
            for (reply, answer) in ready {
                // A closed receiver means the client left; nothing to do then.
                let _ = reply.send(answer);
            }
        }
    }
}

/// A batch's place in the order. Answering through it holds the answers until their turn; a
/// ticket dropped unanswered (a panicking run) gives its turn up, so later batches never wait
/// forever (its requests' reply channels are dropped, which their callers see as an error).
#[derive(Debug)]
pub struct Ticket {
    seq: u64,
    /// `None` once answered.
    order: Option<Arc<Reorder>>,
}

impl Ticket {
    /// Sends the batch's answers in their turn.
    pub fn answer(mut self, answers: Vec<Delivery>) {
        if let Some(order) = self.order.take() {
            order.finish(self.seq, answers);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(order) = self.order.take() {
            order.finish(self.seq, Vec::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn answer(value: u8) -> (Delivery, oneshot::Receiver<Result<Vec<OutputTensor>>>) {
        let (tx, rx) = oneshot::channel();
        let out = OutputTensor {
            name: value.to_string(),
            datatype: tessera_protocol::DataType::Uint8,
            shape: vec![1],
            data: bytes::Bytes::from(vec![value]),
        };
        ((tx, Ok(vec![out])), rx)
    }

    #[test]
    fn later_batches_wait_for_earlier_ones_and_go_together() {
        let order = Arc::new(Reorder::default());
        let (t0, t1, t2) = (order.ticket(0), order.ticket(1), order.ticket(2));
        let (a1, mut r1) = answer(1);
        let (a2, mut r2) = answer(2);
        t2.answer(vec![a2]);
        t1.answer(vec![a1]);
        assert!(r1.try_recv().is_err() && r2.try_recv().is_err(), "batch 0 has not finished");
        let (a0, mut r0) = answer(0);
        t0.answer(vec![a0]);
        for (rx, want) in [(&mut r0, "0"), (&mut r1, "1"), (&mut r2, "2")] {
            let got = rx.try_recv().expect("released").expect("ok");
            assert_eq!(got[0].name, want);
        }
    }

    #[test]
    fn a_ticket_dropped_unanswered_gives_up_its_turn() {
        let order = Arc::new(Reorder::default());
        let (t0, t1) = (order.ticket(0), order.ticket(1));
        let (a1, mut r1) = answer(1);
        t1.answer(vec![a1]);
        drop(t0);
        assert!(r1.try_recv().expect("released").is_ok());
    }
}
