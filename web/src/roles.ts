// Roles as the API orders them, and what each may do in the console.

import type { components } from './api/schema';

/** A role from the API. */
export type Role = components['schemas']['Role'];

/** Lowest to highest: each role can do everything below it. */
export const ROLES: readonly Role[] = ['inference', 'viewer', 'deployer', 'tenant-admin', 'platform-admin'];

/** Whether `role` is at least `needed`. */
export function atLeast(role: Role, needed: Role): boolean {
  return ROLES.indexOf(role) >= ROLES.indexOf(needed);
}

/** What the console shows or enables for a role. */
export interface Abilities {
  read: boolean;
  moveAliases: boolean;
  /** Upload versions, create, scale and delete deployments (deployers and up). */
  deploy: boolean;
  readAudit: boolean;
  /** Read a deployment's captured requests (viewers and up, as the API allows). */
  readCaptures: boolean;
  /** Set how long the tenant's capture files are kept (tenant admins and up). */
  setRetention: boolean;
  /** Create and revoke API keys (tenant admins and up). */
  manageKeys: boolean;
  platform: boolean;
}

/** The abilities of a role (the API enforces them; the console only hides and disables). */
export function abilitiesOf(role: Role): Abilities {
  return {
    read: atLeast(role, 'viewer'),
    moveAliases: atLeast(role, 'deployer'),
    deploy: atLeast(role, 'deployer'),
    readAudit: atLeast(role, 'tenant-admin'),
    readCaptures: atLeast(role, 'viewer'),
    setRetention: atLeast(role, 'tenant-admin'),
    manageKeys: atLeast(role, 'tenant-admin'),
    platform: role === 'platform-admin',
  };
}

/** The roles a key created by `creator` may get: none above the creator's own, and
 *  `platform-admin` only in the platform tenant (the API refuses the rest). */
export function grantableRoles(creator: Role, inPlatformTenant: boolean): Role[] {
  return ROLES.filter((r) => atLeast(creator, r) && (r !== 'platform-admin' || inPlatformTenant));
}

/** The reason shown on a control the role cannot use. */
export function needs(role: Role): string {
  return `Needs the ${role} role`;
}
