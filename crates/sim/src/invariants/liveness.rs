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
