/*
 * auth_oracle.h - the handshake of comm/auth.h computed a second time, with
 * OpenSSL's one-shot SHA256/HMAC and none of auth.c's code, for the fuzz
 * targets: a target that holds the token builds a correct proof from it
 * (so the fuzzer gets past the handshake and reaches the protocol behind
 * it), and checks what auth.c sends back against the contract.
 *
 *   key   = SHA-256(token)
 *   proof = "STA1" | nc | HMAC(key, "c" | ns | nc)     (client -> server, 68 bytes)
 *   answer = HMAC(key, "s" | ns | nc)                  (server -> client, 32 bytes)
 */
#ifndef FUZZ_AUTH_ORACLE_H
#define FUZZ_AUTH_ORACLE_H

#include <stdint.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include "comm/auth.h"

/* The token every target uses (the fuzzer "holds" it). */
#define ORACLE_TOKEN "fuzz-run-token-0123456789abcdef"

/* A token as st_token_load would make it from ORACLE_TOKEN. */
static inline void oracle_token(st_token *t)
{
	memset(t, 0, sizeof(*t));
	t->set = 1;
	SHA256((const unsigned char *)ORACLE_TOKEN, strlen(ORACLE_TOKEN), t->key);
	strcpy(t->source, "SLICETRAIN_TOKEN");
}

/* HMAC(key, tag | ns | nc) into mac. */
static inline void oracle_mac(const uint8_t key[ST_AUTH_KEY], char tag, const uint8_t ns[ST_AUTH_NONCE],
			      const uint8_t nc[ST_AUTH_NONCE], uint8_t mac[ST_AUTH_MAC])
{
	uint8_t msg[1 + 2 * ST_AUTH_NONCE];
	unsigned int len = ST_AUTH_MAC;
	msg[0] = (uint8_t)tag;
	memcpy(msg + 1, ns, ST_AUTH_NONCE);
	memcpy(msg + 1 + ST_AUTH_NONCE, nc, ST_AUTH_NONCE);
	HMAC(EVP_sha256(), key, ST_AUTH_KEY, msg, sizeof(msg), mac, &len);
}

/* The client's correct proof for the server's hello (whose nonce is hello + 4). */
static inline void oracle_proof(const uint8_t key[ST_AUTH_KEY], const uint8_t hello[ST_AUTH_HELLO],
				const uint8_t nc[ST_AUTH_NONCE], uint8_t proof[ST_AUTH_PROOF])
{
	memcpy(proof, "STA1", 4);
	memcpy(proof + 4, nc, ST_AUTH_NONCE);
	oracle_mac(key, 'c', hello + 4, nc, proof + 4 + ST_AUTH_NONCE);
}

#endif
