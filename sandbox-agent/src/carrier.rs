//! What a VM or a pod provides to the run driver: the byte channel to the agent, whether the
//! thing carrying it (the VMM, the exec stream) has ended, diagnostics for errors, and
//! teardown.

use std::os::unix::net::UnixStream;

use crate::place::Place;

/// The carrier of an agent channel: a VM (its virtio-serial port) or a pod (an exec stream).
pub trait Carrier: Send {
    /// Where the agent runs, for the wording of every message.
    fn place(&self) -> Place;

    /// A handle on the host end of the agent channel.
    ///
    /// # Errors
    /// When the channel is closed (after [`Carrier::teardown`]) or cannot be duplicated.
    fn channel(&self) -> std::io::Result<UnixStream>;

    /// Whether the carrier has ended (the VMM exited, the exec stream ended): then the
    /// channel is dead.
    fn ended(&mut self) -> bool;

    /// What the carrier last said (a serial console's tail, the exec's standard error), for
    /// error messages.
    fn diagnostics(&self) -> String;

    /// Ends the carrier (switches the VM off, closes the exec stream) and reaps what it
    /// started. Idempotent.
    fn teardown(&mut self);
}
