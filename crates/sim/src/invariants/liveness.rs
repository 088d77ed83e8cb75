//! After the faults heal, the cluster serves again: every client completes a
//! fresh acquire and release, and every node ends on the same table.

use std::collections::BTreeSet;

#[derive(Debug, Default)]
pub struct Check {
    /// Clients that completed a cycle after the heal.
    served: BTreeSet<usize>,
}

impl Check {
    pub fn served(&mut self, client: usize) {
        self.served.insert(client);
    }

    pub fn finish(&self, clients: usize, converged: bool) -> Result<(), String> {
        if !converged {
            return Err("the nodes did not converge after the heal".into());
        }
        let starved: Vec<usize> =
            (0..clients).filter(|client| !self.served.contains(client)).map(|c| c + 1).collect();
        if starved.is_empty() {
            Ok(())
        } else {
            Err(format!("clients {starved:?} were not served after the heal"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_not_served_after_the_heal_is_caught() {
        let mut check = Check::default();
        check.served(0);
        check.served(2);
        let err = check.finish(4, true).unwrap_err();
        assert!(err.contains("clients [2, 4] were not served after the heal"), "{err}");
    }

    #[test]
    fn nodes_that_did_not_converge_are_caught() {
        let mut check = Check::default();
        for client in 0..3 {
            check.served(client);
        }
        let err = check.finish(3, false).unwrap_err();
        assert!(err.contains("did not converge"), "{err}");
    }

    #[test]
    fn every_client_served_once_or_more_in_any_order_passes() {
        let mut check = Check::default();
        assert!(check.finish(0, true).is_ok(), "no clients, nobody starved");
        for client in [2, 0, 1, 2, 0] {
            check.served(client);
        }
        assert!(check.finish(3, true).is_ok());
    }
}
