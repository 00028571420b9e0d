//! Keys: an agent's secret ([`AgentKey`]), its public half ([`PublicKey`]), and the key
//! two agents share for HMAC ([`PairKey`]).

use super::*;

// ---------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------

/// An agent's secret: 32 random bytes. The Ed25519 signing key and the HMAC secret are
/// derived from it (HKDF-SHA256, distinct labels). Wiped from memory on drop; `Debug` never
/// prints it. Store it with [`AgentKey::to_base64`] or [`AgentKey::to_hex`].
#[derive(Clone)]
pub struct AgentKey(pub(super) [u8; 32]);

impl AgentKey {
    /// A fresh key from the OS random source.
    ///
    /// # Errors
    /// [`Error::Internal`] when the OS has no randomness to give.
    pub fn generate() -> Result<AgentKey> {
        let mut bytes = [0u8; 32];
        random(&mut bytes, "agent key")?;
        let key = AgentKey(bytes);
        bytes.zeroize();
        Ok(key)
    }

    /// The key with these bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> AgentKey {
        AgentKey(bytes)
    }

    /// The raw bytes (keep them secret).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex characters (either case).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input; the message does not repeat the input.
    pub fn from_hex(text: &str) -> Result<AgentKey> {
        unhex("agent key", text.trim()).map(AgentKey)
    }

    /// Standard base64 with padding, 44 characters.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0)
    }

    /// Parses standard base64 of 32 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input; the message does not repeat the input.
    pub fn from_base64(text: &str) -> Result<AgentKey> {
        unbase64("agent key", text.trim()).map(AgentKey)
    }

    /// The Ed25519 public key others verify this agent's signatures with.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.signing_key().verifying_key())
    }

    pub(super) fn signing_key(&self) -> SigningKey {
        let mut seed = hkdf(DOMAIN.as_bytes(), &[&self.0], &[b"ed25519-seed"]);
        let key = SigningKey::from_bytes(&seed);
        seed.zeroize();
        key
    }

    pub(super) fn hmac_secret(&self) -> [u8; 32] {
        hkdf(DOMAIN.as_bytes(), &[&self.0], &[b"hmac-secret"])
    }
}

impl Drop for AgentKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AgentKey(<secret>)")
    }
}

/// An agent's Ed25519 public key. Only valid curve points that are not of small order are
/// accepted. Serialized as lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(pub(super) VerifyingKey);

impl PublicKey {
    /// The key with these bytes (the compressed Edwards point).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when they are not a point, or a weak (small-order) one.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PublicKey> {
        let key = VerifyingKey::from_bytes(bytes)
            .map_err(|_| Error::invalid("public key: not an Ed25519 point"))?;
        if key.is_weak() {
            return Err(Error::invalid("public key: a weak (small-order) point"));
        }
        Ok(PublicKey(key))
    }

    /// The 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex(self.0.as_bytes())
    }

    /// Parses 64 hex characters (either case).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input or an invalid key.
    pub fn from_hex(text: &str) -> Result<PublicKey> {
        PublicKey::from_bytes(&unhex("public key", text.trim())?)
    }

    /// Standard base64 with padding.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0.as_bytes())
    }

    /// Parses standard base64 of 32 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input or an invalid key.
    pub fn from_base64(text: &str) -> Result<PublicKey> {
        PublicKey::from_bytes(&unbase64("public key", text.trim())?)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}

impl Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        PublicKey::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// The HMAC-SHA256 key two agents share. Wiped from memory on drop; `Debug` never prints it.
#[derive(Clone)]
pub struct PairKey(pub(super) [u8; 32]);

impl PairKey {
    /// The pair key of agents `a` and `b` derived from their secrets: HKDF-SHA256 with salt
    /// [`DOMAIN`], input the two agents' HMAC secrets and info `hmac-pair` and both names,
    /// the pair ordered by name, so `derive(a, ka, b, kb) == derive(b, kb, a, ka)`.
    pub fn derive(a: &str, a_key: &AgentKey, b: &str, b_key: &AgentKey) -> PairKey {
        let ((lo, lo_key), (hi, hi_key)) = if a <= b {
            ((a, a_key), (b, b_key))
        } else {
            ((b, b_key), (a, a_key))
        };
        let mut lo_secret = lo_key.hmac_secret();
        let mut hi_secret = hi_key.hmac_secret();
        let mut info = b"hmac-pair".to_vec();
        put(&mut info, lo.as_bytes());
        put(&mut info, hi.as_bytes());
        let key = hkdf(DOMAIN.as_bytes(), &[&lo_secret, &hi_secret], &[&info]);
        lo_secret.zeroize();
        hi_secret.zeroize();
        PairKey(key)
    }

    /// The key with these bytes (a key agreed on elsewhere).
    pub fn from_bytes(bytes: [u8; 32]) -> PairKey {
        PairKey(bytes)
    }

    /// The raw bytes (keep them secret).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex characters (either case).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input; the message does not repeat the input.
    pub fn from_hex(text: &str) -> Result<PairKey> {
        unhex("pair key", text.trim()).map(PairKey)
    }

    /// Standard base64 with padding, 44 characters.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0)
    }

    /// Parses standard base64 of 32 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input; the message does not repeat the input.
    pub fn from_base64(text: &str) -> Result<PairKey> {
        unbase64("pair key", text.trim()).map(PairKey)
    }
}

impl Drop for PairKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for PairKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairKey(<secret>)")
    }
}
