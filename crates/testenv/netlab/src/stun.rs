//! The lab's STUN service. Headscale's embedded DERP server advertises STUN on the lab
//! gateway, but Headscale runs in the root netns and its STUN socket listens on `127.0.0.1`
//! there, which no lab netns reaches (the gateway forwards only TCP). Without an answer,
//! every tailscaled's netcheck waits ~3 s for its STUN probes to time out ("UDP is blocked")
//! before it picks a home DERP and turns `Running`: a delay a deployment with a reachable
//! STUN port does not have. This responder answers binding requests at the gateway as a
//! reachable STUN server would: with the client's own address (XOR-MAPPED-ADDRESS).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use bytecodec::{DecodeExt, EncodeExt};
use stun_codec::rfc5389::Attribute;
use stun_codec::rfc5389::attributes::XorMappedAddress;
use stun_codec::rfc5389::methods::BINDING;
use stun_codec::{Message, MessageClass, MessageDecoder, MessageEncoder};

use crate::error::{NetlabError, Result};
use crate::netns::Netns;

/// Answers STUN binding requests on a UDP address inside a netns until dropped.
#[derive(Debug)]
pub struct StunResponder {
    local_addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StunResponder {
    pub fn start(netns: &Netns, listen: SocketAddr) -> Result<StunResponder> {
        let socket = netns
            .in_netns(move || UdpSocket::bind(listen))?
            .map_err(|e| NetlabError::io(format!("binding UDP {listen} in {}", netns.name()), e))?;
        // A short timeout so the thread sees `stopping` without a packet arriving.
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .map_err(|e| NetlabError::io("setting the STUN socket's timeout", e))?;
        let local_addr = socket
            .local_addr()
            .map_err(|e| NetlabError::io("reading the STUN socket's address", e))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let thread = {
            let stopping = stopping.clone();
            std::thread::Builder::new()
                .name(format!("stun-{local_addr}"))
                .spawn(move || serve(&socket, &stopping))
                .map_err(|e| NetlabError::io("spawning the STUN thread", e))?
        };
        Ok(StunResponder {
            local_addr,
            stopping,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for StunResponder {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(socket: &UdpSocket, stopping: &AtomicBool) {
    let mut buffer = [0u8; 1500];
    while !stopping.load(Ordering::SeqCst) {
        let Ok((length, peer)) = socket.recv_from(&mut buffer) else {
            continue;
        };
        if let Some(response) = binding_response(&buffer[..length], peer) {
            let _ = socket.send_to(&response, peer);
        }
    }
}

/// The success response to a binding request from `peer`; `None` for anything else.
pub fn binding_response(request: &[u8], peer: SocketAddr) -> Option<Vec<u8>> {
    let request = MessageDecoder::<Attribute>::new()
        .decode_from_bytes(request)
        .ok()?
        .ok()?;
    if request.class() != MessageClass::Request || request.method() != BINDING {
        return None;
    }
    let mut response = Message::<Attribute>::new(
        MessageClass::SuccessResponse,
        BINDING,
        request.transaction_id(),
    );
    response.add_attribute(Attribute::XorMappedAddress(XorMappedAddress::new(peer)));
    MessageEncoder::new().encode_into_bytes(response).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use stun_codec::TransactionId;

    #[test]
    fn a_binding_request_is_answered_with_the_peer_s_address_and_anything_else_is_not() {
        let id = TransactionId::new([7; 12]);
        let request = Message::<Attribute>::new(MessageClass::Request, BINDING, id);
        let bytes = MessageEncoder::new()
            .encode_into_bytes(request)
            .unwrap_or_default();
        let peer: SocketAddr = "10.244.1.5:41641"
            .parse()
            .unwrap_or(SocketAddr::from(([0; 4], 0)));
        let response = binding_response(&bytes, peer).unwrap_or_default();
        let decoded = MessageDecoder::<Attribute>::new()
            .decode_from_bytes(&response)
            .ok()
            .and_then(Result::ok);
        let Some(decoded) = decoded else {
            panic!("the response does not decode");
        };
        assert_eq!(decoded.class(), MessageClass::SuccessResponse);
        assert_eq!(decoded.transaction_id(), id);
        let mapped = decoded
            .get_attribute::<XorMappedAddress>()
            .map(XorMappedAddress::address);
        assert_eq!(mapped, Some(peer));

        assert_eq!(binding_response(b"not stun", peer), None);
        let indication = Message::<Attribute>::new(MessageClass::Indication, BINDING, id);
        let bytes = MessageEncoder::new()
            .encode_into_bytes(indication)
            .unwrap_or_default();
        assert_eq!(binding_response(&bytes, peer), None);
    }
}
