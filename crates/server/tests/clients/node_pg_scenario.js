// End-to-end scenario with node-postgres (`pg`) against `spindle serve`.
//
// Run by crates/server/tests/clients.rs as `node node_pg_scenario.js PORT`;
// exits non-zero when anything is off.

const assert = require('node:assert/strict');
const { Client } = require('pg');

async function expectError(promise, code) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.code, code, `expected SQLSTATE ${code}, got ${e.code}: ${e.message}`);
    return e;
  }
  assert.fail(`expected SQLSTATE ${code}, the statement succeeded`);
}

async function main() {
  const port = parseInt(process.argv[2], 10);
  const client = new Client({ host: '127.0.0.1', port, user: 'spindle', database: 'spindle' });
  await client.connect();

  // Interleaved tables, in GoogleSQL's spelling.
  await client.query(
    'CREATE TABLE Singers (SingerId INT64 NOT NULL, FirstName STRING(1024), Active BOOL) PRIMARY KEY (SingerId)');
  await client.query(
    'CREATE TABLE Albums (SingerId INT64 NOT NULL, AlbumId INT64 NOT NULL, AlbumTitle STRING(MAX), ' +
    'Info JSON) PRIMARY KEY (SingerId, AlbumId), INTERLEAVE IN PARENT Singers ON DELETE CASCADE');

  // Parameterized inserts (untyped text parameters: the server infers types).
  let r = await client.query('INSERT INTO Singers (SingerId, FirstName, Active) VALUES ($1, $2, $3)', [1, 'Marc', true]);
  assert.equal(r.rowCount, 1);
  assert.equal(r.command, 'INSERT');
  await client.query('INSERT INTO Singers (SingerId, FirstName, Active) VALUES ($1, $2, $3)', [2, 'Catalina', null]);
  r = await client.query('INSERT INTO Albums VALUES ($1, $2, $3, $4), ($1, $5, $6, NULL)',
    [1, 1, 'Total Junk', JSON.stringify({ tracks: 10 }), 2, 'Go, Go, Go']);
  assert.equal(r.rowCount, 2);

  // Parameterized selects; int8 comes back as a string, as from PostgreSQL.
  r = await client.query('SELECT SingerId, FirstName, Active FROM Singers WHERE SingerId = $1', [1]);
  assert.deepEqual(r.rows, [{ singerid: '1', firstname: 'Marc', active: true }]);
  r = await client.query('SELECT FirstName FROM Singers WHERE Active IS NULL');
  assert.deepEqual(r.rows, [{ firstname: 'Catalina' }]);
  r = await client.query('SELECT AlbumTitle, Info FROM Albums WHERE SingerId = $1 ORDER BY AlbumId', ['1']);
  assert.equal(r.rows.length, 2);
  assert.equal(r.rows[0].albumtitle, 'Total Junk');
  assert.deepEqual(r.rows[0].info, { tracks: 10 }); // jsonb is parsed by pg
  assert.equal(r.rows[1].info, null);
  // A named prepared statement reused.
  for (const id of [1, 2]) {
    r = await client.query({ name: 'singer-by-id', text: 'SELECT FirstName FROM Singers WHERE SingerId = $1', values: [id] });
    assert.equal(r.rows.length, 1);
  }

  // A transaction that commits.
  await client.query('BEGIN');
  await client.query('INSERT INTO Singers (SingerId, FirstName) VALUES ($1, $2)', [3, 'Alice']);
  await client.query('INSERT INTO Albums (SingerId, AlbumId, AlbumTitle) VALUES ($1, $2, $3)', [3, 1, 'Wonder']);
  await client.query('COMMIT');
  r = await client.query('SELECT count(*) AS n FROM Albums WHERE SingerId = $1', [3]);
  assert.equal(r.rows[0].n, '1');

  // A transaction that rolls back.
  await client.query('BEGIN');
  await client.query('DELETE FROM Singers WHERE SingerId = $1', [3]);
  r = await client.query('SELECT count(*) AS n FROM Albums WHERE SingerId = $1', [3]);
  assert.equal(r.rows[0].n, '0'); // the cascade, seen inside the transaction
  await client.query('ROLLBACK');
  r = await client.query('SELECT count(*) AS n FROM Albums WHERE SingerId = $1', [3]);
  assert.equal(r.rows[0].n, '1');

  // Errors with their SQLSTATE; the connection stays usable.
  await expectError(client.query('INSERT INTO Singers (SingerId, FirstName) VALUES ($1, $2)', [1, 'again']), '23505');
  await expectError(client.query('INSERT INTO Albums (SingerId, AlbumId) VALUES ($1, $2)', [9, 1]), '23503');
  await expectError(client.query('SELECT * FROM NoSuchTable'), '42P01');
  await expectError(client.query('SELECT FirstName FROM Singers WHERE SingerId = $1', ['not a number']), '22P02');
  // A failed transaction block: 25P02 until ROLLBACK.
  await client.query('BEGIN');
  await expectError(client.query('INSERT INTO Singers (SingerId) VALUES ($1)', [1]), '23505');
  await expectError(client.query('SELECT 1'), '25P02');
  await client.query('ROLLBACK');
  r = await client.query('SELECT count(*) AS n FROM Singers');
  assert.equal(r.rows[0].n, '3');

  await client.end();
  console.log('node pg scenario: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
