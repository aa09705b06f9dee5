"""Signed token proofs: each kind of bad proof is caught, with its reason; keys load or are refused."""

import struct

import msgpack
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.client import proof as proof_mod
from coordinator.client.proof import (
    PROOF_BYTES_MAX,
    PROOF_DOMAIN,
    PROOF_TEXT_PREFIX,
    PROOF_VERSION,
    TOKEN_MAX,
    InvalidProof,
    ProofError,
    ProofSigner,
    ProofVerifier,
    TokenProof,
    from_text,
    generate_key_pair,
    key_id_of,
    load_private_key,
    load_public_key,
    to_text,
)

# Module-level keys: hypothesis runs many examples per test and function-scoped fixtures
# would not be reset between them anyway.
KEY = Ed25519PrivateKey.generate()
OTHER_KEY = Ed25519PrivateKey.generate()
SIGNER = ProofSigner(KEY)
VERIFIER = ProofVerifier([KEY.public_key()])


def _fields(proof: bytes) -> list:
    return msgpack.unpackb(proof, raw=False)


def _pack(fields: list) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def _reason(proof, resource=None, verifier=VERIFIER) -> str:
    with pytest.raises(InvalidProof) as info:
        verifier.verify(proof, resource=resource)
    return info.value.reason


# -- valid proofs -------------------------------------------------------------------------


def test_round_trip_bytes_and_text():
    proof = SIGNER.sign("orders/7", 42)
    expected = TokenProof(resource="orders/7", token=42, key_id=SIGNER.key_id)
    assert VERIFIER.verify(proof) == expected
    assert VERIFIER.verify(proof, resource="orders/7") == expected
    text = to_text(proof)
    assert text.startswith(PROOF_TEXT_PREFIX) and text.isascii() and "=" not in text
    assert from_text(text) == proof
    assert VERIFIER.verify(text, resource="orders/7") == expected


def test_format_is_the_documented_array():
    """[1, key_id, resource, token, signature]; key_id is sha256(raw public key)[:8]."""
    version, key_id, resource, token, signature = _fields(SIGNER.sign("r", 9))
    assert (version, resource, token) == (PROOF_VERSION, "r", 9)
    assert key_id == key_id_of(KEY.public_key()) == SIGNER.key_id and len(key_id) == 8
    assert len(signature) == 64


def test_token_bounds_are_accepted():
    for token in (1, 2**63, TOKEN_MAX):
        assert VERIFIER.verify(SIGNER.sign("r", token)).token == token


def test_signer_refuses_tokens_outside_uint64():
    for token in (0, -1, TOKEN_MAX + 1):
        with pytest.raises(ValueError):
            SIGNER.sign("r", token)


# -- malformed ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "garbage",
    [b"", b"\xc1", b"not a proof", b"\x95\x01", _pack({"token": 5}), _pack([1, 2, 3])],
    ids=["empty", "reserved-byte", "text", "truncated", "map", "short-list"],
)
def test_garbage_bytes_are_malformed(garbage):
    assert _reason(garbage) == "malformed"


def test_not_bytes_nor_text_is_malformed():
    assert _reason(12345) == "malformed"


def test_wrong_version_is_malformed_even_with_a_valid_signature():
    """A version-2 proof signed correctly (over its own fields) is still refused."""
    key_id = SIGNER.key_id
    signature = KEY.sign(PROOF_DOMAIN + _pack([2, key_id, "r", 5]))
    assert _reason(_pack([2, key_id, "r", 5, signature])) == "malformed"
    assert _reason(_pack([0, key_id, "r", 5, signature])) == "malformed"
    assert _reason(_pack(["1", key_id, "r", 5, signature])) == "malformed"


@pytest.mark.parametrize(
    "index, value",
    [
        (1, "8-chars!"),  # key_id as str
        (1, b"short"),  # key_id of the wrong size
        (2, b"r"),  # resource as bytes
        (2, 7),  # resource as int
        (3, "5"),  # token as str
        (3, 5.0),  # token as float
        (3, True),  # token as bool
        (3, None),
        (4, b"\x00" * 63),  # signature one byte short
        (4, "s" * 64),  # signature as str
    ],
)
def test_wrong_field_types_are_malformed(index, value):
    fields = _fields(SIGNER.sign("r", 5))
    fields[index] = value
    assert _reason(_pack(fields)) == "malformed"


def test_six_fields_are_malformed():
    assert _reason(_pack(_fields(SIGNER.sign("r", 5)) + [b"extra"])) == "malformed"


@pytest.mark.parametrize("token", [0, -1, -(2**63)])
def test_token_zero_or_negative_is_malformed_even_if_signed(token):
    """Hand-made proofs, signed with the real key: the range check, not the signature, refuses."""
    key_id = SIGNER.key_id
    signature = KEY.sign(PROOF_DOMAIN + _pack([PROOF_VERSION, key_id, "r", token]))
    assert _reason(_pack([PROOF_VERSION, key_id, "r", token, signature])) == "malformed"


def test_token_above_uint64_is_malformed():
    """msgpack has no integer above 2**64-1, so such a token can only arrive as another type."""
    with pytest.raises(OverflowError):
        _pack([TOKEN_MAX + 1])
    key_id = SIGNER.key_id
    for token in (float(TOKEN_MAX + 1), str(TOKEN_MAX + 1), (TOKEN_MAX + 1).to_bytes(9, "big")):
        signature = KEY.sign(PROOF_DOMAIN + _pack([PROOF_VERSION, key_id, "r", token]))
        assert _reason(_pack([PROOF_VERSION, key_id, "r", token, signature])) == "malformed"


def test_oversize_proof_is_malformed():
    assert _reason(b"\x00" * (PROOF_BYTES_MAX + 1)) == "malformed"
    # The signer makes no proof for a name the coordinator would never issue a token for ...
    with pytest.raises(ValueError):
        SIGNER.sign("x" * 257, 5)
    # ... and a hand-signed one does not help: the size is checked first.
    resource = "x" * PROOF_BYTES_MAX
    signature = SIGNER._key.sign(proof_mod._signed_part(SIGNER.key_id, resource, 5))
    long_proof = msgpack.packb([1, SIGNER.key_id, resource, 5, signature], use_bin_type=True)
    assert len(long_proof) > PROOF_BYTES_MAX
    assert _reason(long_proof) == "malformed"
    assert _reason(to_text(long_proof)) == "malformed"
    assert _reason(PROOF_TEXT_PREFIX + "A" * (2 * PROOF_BYTES_MAX + 1)) == "malformed"


@pytest.mark.parametrize("prefix", ["", "fp2.", "FP1.", "fp1", " fp1."])
def test_bad_text_prefix_is_malformed(prefix):
    body = to_text(SIGNER.sign("r", 5))[len(PROOF_TEXT_PREFIX):]
    assert _reason(prefix + body) == "malformed"


@pytest.mark.parametrize("body", ["A", "AAAAA", "é"], ids=["1-char", "5-chars", "non-ascii"])
def test_bad_base64_is_malformed(body):
    with pytest.raises(InvalidProof) as info:
        from_text(PROOF_TEXT_PREFIX + body)
    assert info.value.reason == "malformed"
    assert _reason(PROOF_TEXT_PREFIX + body) == "malformed"


def test_stray_characters_in_the_text_form_are_refused_not_skipped():
    body = to_text(SIGNER.sign("r", 5))[len(PROOF_TEXT_PREFIX):]
    assert from_text(PROOF_TEXT_PREFIX + body) == SIGNER.sign("r", 5)
    for spoiled in ("!!" + body, body[:10] + " " + body[10:], body + "\n"):
        with pytest.raises(InvalidProof) as info:
            from_text(PROOF_TEXT_PREFIX + spoiled)
        assert info.value.reason == "malformed"


# -- unknown key, bad signature, wrong resource -------------------------------------------


def test_proof_from_another_key_is_unknown_key():
    assert _reason(ProofSigner(OTHER_KEY).sign("r", 5)) == "unknown_key"


def test_one_flipped_bit_in_the_signature_is_bad_signature():
    fields = _fields(SIGNER.sign("r", 5))
    for bit in (0, 7, 300, 511):
        signature = bytearray(fields[4])
        signature[bit // 8] ^= 1 << (bit % 8)
        assert _reason(_pack(fields[:4] + [bytes(signature)])) == "bad_signature"


@pytest.mark.parametrize("forged", [6, 2**63, TOKEN_MAX, 4], ids=["next", "2**63", "max", "lower"])
def test_edited_token_is_bad_signature(forged):
    """The key test: a holder of token 5 cannot turn its proof into one for a bigger token."""
    fields = _fields(SIGNER.sign("orders/7", 5))
    fields[3] = forged
    assert _reason(_pack(fields)) == "bad_signature"
    assert _reason(_pack(fields), resource="orders/7") == "bad_signature"


def test_edited_resource_is_bad_signature():
    fields = _fields(SIGNER.sign("orders/7", 5))
    fields[2] = "orders/8"
    assert _reason(_pack(fields)) == "bad_signature"
    assert _reason(_pack(fields), resource="orders/8") == "bad_signature"


def test_key_id_swapped_to_another_trusted_key_is_bad_signature():
    both = ProofVerifier([KEY.public_key(), OTHER_KEY.public_key()])
    fields = _fields(SIGNER.sign("r", 5))
    fields[1] = key_id_of(OTHER_KEY.public_key())
    assert _reason(_pack(fields), verifier=both) == "bad_signature"


def test_signature_without_the_domain_prefix_is_bad_signature():
    """A signature the same key made for another purpose (no PROOF_DOMAIN) is no proof."""
    key_id = SIGNER.key_id
    for message in (
        _pack([PROOF_VERSION, key_id, "r", 5]),
        b"another domain\x00" + _pack([PROOF_VERSION, key_id, "r", 5]),
    ):
        assert _reason(_pack([PROOF_VERSION, key_id, "r", 5, KEY.sign(message)])) == "bad_signature"
    # Control: the same fields signed with the domain verify.
    good = KEY.sign(PROOF_DOMAIN + _pack([PROOF_VERSION, key_id, "r", 5]))
    assert VERIFIER.verify(_pack([PROOF_VERSION, key_id, "r", 5, good])).token == 5


def test_proof_for_another_resource_is_wrong_resource():
    proof = SIGNER.sign("orders/7", 5)
    assert _reason(proof, resource="orders/8") == "wrong_resource"
    assert _reason(proof, resource="orders/7 ") == "wrong_resource"
    assert _reason(to_text(proof), resource="") == "wrong_resource"


# -- key rotation -------------------------------------------------------------------------


def test_key_rotation():
    """While rotating, both keys verify; once the old key is dropped its proofs are unknown_key."""
    old, new = ProofSigner(KEY), ProofSigner(OTHER_KEY)
    both = ProofVerifier([KEY.public_key(), OTHER_KEY.public_key()])
    assert set(both.key_ids) == {old.key_id, new.key_id}
    assert both.verify(old.sign("r", 5)) == TokenProof("r", 5, old.key_id)
    assert both.verify(new.sign("r", 6)) == TokenProof("r", 6, new.key_id)
    new_only = ProofVerifier([OTHER_KEY.public_key()])
    assert new_only.verify(new.sign("r", 6)).token == 6
    assert _reason(old.sign("r", 5), verifier=new_only) == "unknown_key"


def test_verifier_needs_ed25519_public_keys():
    with pytest.raises(ProofError, match="at least one"):
        ProofVerifier([])
    with pytest.raises(ProofError, match="not an Ed25519"):
        ProofVerifier([KEY])  # the private key is not a public key
    with pytest.raises(ProofError, match="not an Ed25519"):
        ProofVerifier([ec.generate_private_key(ec.SECP256R1()).public_key()])


# -- key files ----------------------------------------------------------------------------


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_generated_key_pair_loads_back_and_works(tmp_path):
    private_pem, public_pem = generate_key_pair()
    private_path = _write(tmp_path / "cluster.key", private_pem)
    public_path = _write(tmp_path / "cluster.pub", public_pem)
    private, public = load_private_key(private_path), load_public_key(public_path)
    assert key_id_of(private.public_key()) == key_id_of(public)
    proof = ProofSigner.from_file(private_path).sign("r", 11)
    assert ProofVerifier.from_files(public_path).verify(proof, resource="r").token == 11


def test_two_generated_pairs_differ():
    assert generate_key_pair() != generate_key_pair()


def test_load_public_key_refuses_a_private_key_file(tmp_path):
    private_pem, _ = generate_key_pair()
    path = _write(tmp_path / "cluster.key", private_pem)
    with pytest.raises(ProofError, match="private key"):
        load_public_key(path)
    with pytest.raises(ProofError):
        ProofVerifier.from_files(path)


def test_key_loaders_refuse_a_non_pem_file(tmp_path):
    raw = KEY.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    path = _write(tmp_path / "cluster.der", raw)
    with pytest.raises(ProofError, match="not PEM"):
        load_public_key(path)
    with pytest.raises(ProofError, match="not PEM"):
        load_private_key(path)


def test_key_loaders_refuse_a_damaged_pem(tmp_path):
    path = _write(tmp_path / "bad.pem", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ProofError, match="cannot be loaded"):
        load_public_key(path)


def test_key_loaders_refuse_a_non_ed25519_key(tmp_path):
    ec_key = ec.generate_private_key(ec.SECP256R1())
    public_path = _write(
        tmp_path / "ec.pub",
        ec_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    )
    private_path = _write(
        tmp_path / "ec.key",
        ec_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    with pytest.raises(ProofError, match="not an Ed25519 key"):
        load_public_key(public_path)
    with pytest.raises(ProofError, match="not an Ed25519 key"):
        load_private_key(private_path)


def test_load_private_key_names_a_missing_file(tmp_path):
    path = str(tmp_path / "missing" / "cluster.key")
    with pytest.raises(ProofError) as info:
        load_private_key(path)
    assert path in str(info.value)
    with pytest.raises(ProofError, match="missing"):
        ProofSigner.from_file(path)


# -- property -------------------------------------------------------------------------------

_resources = st.text(max_size=256).filter(lambda s: len(s.encode("utf-8")) <= 256)
_tokens = st.integers(min_value=1, max_value=TOKEN_MAX)


@settings(max_examples=300, deadline=None)
@given(resource=_resources, token=_tokens, other=_tokens)
def test_property_round_trip_and_any_other_token_fails(resource, token, other):
    proof = SIGNER.sign(resource, token)
    assert VERIFIER.verify(proof, resource=resource) == TokenProof(resource, token, SIGNER.key_id)
    assert VERIFIER.verify(to_text(proof), resource=resource).token == token
    if other != token:
        fields = _fields(proof)
        fields[3] = other
        assert _reason(_pack(fields)) == "bad_signature"


# -- known weaknesses of proof.py, pinned: strict, so a fix turns them into failures to remove ---


def _version_true(fields: list) -> bytes:
    return _pack([True] + fields[1:])


def _wide_token(fields: list) -> bytes:
    """Token 5 as a msgpack uint64 (0xcf) instead of a fixint."""
    version, key_id, resource, token, signature = fields
    wide = b"\xcf" + struct.pack(">Q", token)
    return b"\x95" + _pack(version) + _pack(key_id) + _pack(resource) + wide + _pack(signature)


@pytest.mark.parametrize("encode", [_version_true, _wide_token], ids=["version-true", "wide-token"])
def test_non_canonical_encodings_of_a_proof_are_refused(encode):
    """Not a forgery (the statement is unchanged), but one statement has many byte strings:
    anything that keys on the proof's bytes (a replay cache, say) can be fooled."""
    fields = _fields(SIGNER.sign("r", 5))
    variant = encode(fields)
    assert variant != SIGNER.sign("r", 5)
    assert _reason(variant) == "malformed"


def test_signer_refuses_a_bool_token():
    with pytest.raises(ValueError):
        SIGNER.sign("r", True)
